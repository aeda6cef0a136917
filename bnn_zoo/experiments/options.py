"""A config class's options taken from the library class it configures: each option's name, type,
default and help text have one home, the library's signature and docstring (its ``Args:`` section),
and the command line, YAML and ``--help`` are generated from them by jsonargparse."""

from __future__ import annotations

import copy
import dataclasses
import inspect
import typing

import docstring_parser

RUNTIME = ("seed", "progress", "checkpoint")  # set by the run itself, never an option


def options(
    target,
    *,
    skip: tuple[str, ...] = (),
    only: tuple[str, ...] | None = None,
    types: dict | None = None,
    required: tuple[str, ...] = (),
):
    """Class decorator (under ``@dataclass``): give the config class ``target``'s parameters, in its order,
    with their defaults and types (``types`` narrows a type to what a command line can say, e.g. a
    Literal), and append their help texts to its docstring's ``Args:``. ``skip``/``only`` pick them.
    Parameters without a default are filled from the data, except those ``required`` of the user: these
    become ``str`` options defaulting to "" (the config's ``load`` names the missing option)."""

    def decorate(cls):
        hints = _hints(target)
        docs = arg_docs(target)
        annotations = dict(cls.__dict__.get("__annotations__", {}))
        lines = []
        for name, param in inspect.signature(target).parameters.items():
            if (
                name in skip
                or name in RUNTIME
                or (only is not None and name not in only)
                or param.kind is param.VAR_KEYWORD
            ):
                continue
            if name in required:
                annotations[name], default = str, ""
            elif param.default is inspect.Parameter.empty:
                continue  # filled from the data (in_features, ...), not an option
            else:
                annotations[name] = (types or {}).get(name, hints.get(name, typing.Any))
                default = param.default
            if isinstance(default, tuple) and typing.get_origin(annotations[name]) is list:
                default = list(default)  # a command line gives lists
            if isinstance(default, list | dict):
                setattr(cls, name, dataclasses.field(default_factory=lambda d=default: copy.deepcopy(d)))
            else:
                setattr(cls, name, default)
            lines.append(f"    {name}: {' '.join(docs.get(name, '').split())}")
        cls.__annotations__ = annotations
        summary = inspect.cleandoc(cls.__doc__ or "")
        cls.__doc__ = summary + ("\n\nArgs:\n" if "Args:" not in summary else "\n") + "\n".join(lines)
        return cls

    return decorate


def arg_docs(target) -> dict[str, str]:
    """Each parameter's help text from the ``Args:`` of ``target``'s docstring, its bases' and those of the
    class named by its ``args_documented_by`` (e.g. HMC's shared arguments, documented on NUTS)."""
    sources = [*getattr(target, "__mro__", (target,)), getattr(target, "args_documented_by", None)]
    docs: dict[str, str] = {}
    for source in filter(None, sources):
        for param in docstring_parser.parse(inspect.getdoc(source) or "").params:
            docs.setdefault(param.arg_name, param.description or "")
    return docs


def _hints(target) -> dict:
    """The parameters' types: a dataclass's fields', another class's ``__init__``'s, a function's own."""
    plain_class = isinstance(target, type) and not dataclasses.is_dataclass(target)
    return typing.get_type_hints(target.__init__ if plain_class else target)
