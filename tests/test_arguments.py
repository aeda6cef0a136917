"""Arguments are never silently coerced or ignored: every parameter of the public API annotated as a
boolean or a choice (a Literal) refuses any other value with one BnnZooError naming it. The test walks
the public signatures (functions, constructors and the public methods of public classes), so a new
parameter is covered as soon as it is written."""

import dataclasses
import importlib
import inspect
import types
import typing

import pytest

import bnn_zoo as bz

PLAUSIBLE = {int: 1, float: 1.0, str: "x", list: [], dict: {}, tuple: ()}
MODULES = ("bnn_zoo.data.tables", "bnn_zoo.data.text", "bnn_zoo.data.datasets")  # public beside bz.__all__


def _modules():
    for name in bz.__all__:
        value = getattr(bz, name)
        if inspect.ismodule(value):
            yield value
    yield bz
    yield from (importlib.import_module(m) for m in MODULES)


def _defined_in(module) -> list:
    names = getattr(module, "__all__", None) or [n for n in vars(module) if not n.startswith("_")]
    out = []
    for name in names:
        value = getattr(module, name)
        home = getattr(value, "__module__", "") or ""
        if (inspect.isclass(value) or inspect.isfunction(value)) and home.startswith("bnn_zoo"):
            if module is bz or home == module.__name__ or hasattr(module, "__all__"):
                out.append(value)
    return out


def _callables():
    """(label, function, whether it takes a leading self) for every public function, constructor and method."""
    seen = set()
    for module in _modules():
        for value in _defined_in(module):
            if value in seen or getattr(value, "_is_protocol", False):
                continue
            seen.add(value)
            if inspect.isfunction(value):
                yield value.__qualname__, value, False
                continue
            yield value.__qualname__, value, False  # its constructor (a dataclass checks its fields)
            for name, member in vars(value).items():
                if inspect.isfunction(member) and not name.startswith("_"):
                    yield f"{value.__qualname__}.{name}", member, True


def _choices(hint) -> str | None:
    """What a bad value must be refused as: a boolean, a choice, or None where the hint is neither."""
    args = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    if any(typing.get_origin(a) is typing.Literal for a in args):
        return "choice"
    return "boolean" if bool in args else None


def _cases():
    for label, fn, method in _callables():
        target = fn.__init__ if inspect.isclass(fn) and not dataclasses.is_dataclass(fn) else fn
        try:
            hints = typing.get_type_hints(target)
        except NameError:
            continue
        for name, hint in hints.items():
            kind = _choices(hint) if name != "return" else None
            if kind:
                yield pytest.param(fn, method, name, kind, id=f"{label}({name})")


CASES = list(_cases())


def test_the_walk_finds_the_public_booleans_and_choices():
    found = {c.id for c in CASES}
    for expected in ("fit(standardize)", "compare(allow_unconverged)", "SVI(objective)", "MLP(activation)"):
        assert expected in found, sorted(found)
    assert len(CASES) > 30


@pytest.mark.parametrize("fn, method, name, kind", CASES)
@pytest.mark.parametrize("bad", ["maybe", 1, None])
def test_a_boolean_or_a_choice_refuses_any_other_value_naming_the_argument(fn, method, name, kind, bad):
    signature = inspect.signature(fn)
    parameter = signature.parameters[name]
    if bad is None and parameter.default is None:
        pytest.skip("None is this argument's own default")
    if bad == 1 and kind == "choice" and 1 in typing.get_args(parameter.annotation):
        pytest.skip("1 is one of the choices")
    hints = typing.get_type_hints(fn.__init__ if inspect.isclass(fn) and not dataclasses.is_dataclass(fn) else fn)
    required = {  # a plausible value of a plain type, None for the rest (tensors, models): never reached
        p.name: PLAUSIBLE.get(hints.get(p.name))
        for p in signature.parameters.values()
        if p.default is p.empty and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name != "self"
    }
    args = (None,) if method else ()
    with pytest.raises(bz.BnnZooError, match=rf"\b{name}\b"):
        fn(*args, **(required | {name: bad}))
