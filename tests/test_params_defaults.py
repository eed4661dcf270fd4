"""No kernel params default differs from the spec's (one knob contract).

Every field of ``TritonParams`` (codegen/triton/params.py) and ``TVMParams`` (codegen/tvm/params.py)
that is a knob of specs/path_attention.yaml defaults to that knob's default in the spec's
``KnobSpace`` of every pass that has the knob; the spec's ``'off'`` for beta_clip_eps is the params'
``None``.  A pair listed in ``KNOWN_MISMATCHES`` is expected to differ (strict xfail, with the reason):
fixing it makes that case pass, and then its entry must go.  Today the list is empty.
"""
from __future__ import annotations

import dataclasses

import pytest

from pathtune.codegen.triton.params import TritonParams
from pathtune.codegen.tvm.params import DECODE_LOCAL_KNOBS, TVMParams
from pathtune.specs import KnobSpace, load_spec

SPEC = load_spec()
SPACES = {p: KnobSpace(SPEC, p) for p in SPEC.passes}
BACKENDS = {"triton": TritonParams, "tvm": TVMParams}

# (backend, knob) -> why its params default differs from the spec's.  Editing codegen/ or the spec to
# fix one retires performance records, so a known difference is listed here until that is done.
KNOWN_MISMATCHES: dict[tuple[str, str], str] = {}


def _field_defaults(cls) -> dict:
    return {f.name: f.default for f in dataclasses.fields(cls) if f.default is not dataclasses.MISSING}


def _params_spelling(value):
    """A spec knob value as the params classes hold it (beta_clip_eps 'off' is None)."""
    return None if isinstance(value, str) and value.lower() == "off" else value


def _cases():
    out = []
    for backend, cls in BACKENDS.items():
        fields = _field_defaults(cls)
        for knob in sorted(set(fields) & set(SPEC.knobs)):
            marks = ()
            if (backend, knob) in KNOWN_MISMATCHES:
                marks = pytest.mark.xfail(strict=True, reason=KNOWN_MISMATCHES[backend, knob])
            out.append(pytest.param(backend, knob, marks=marks, id=f"{backend}-{knob}"))
    return out


@pytest.mark.parametrize("backend,knob", _cases())
def test_params_default_is_the_spec_default(backend, knob):
    field = _field_defaults(BACKENDS[backend])[knob]
    passes = [p for p, space in SPACES.items() if knob in space.knobs]
    assert passes, f"{knob} is a spec knob of no pass"
    for p in passes:
        spec_default = SPACES[p].default()[knob]
        want = _params_spelling(spec_default)
        assert field == want and type(field) is type(want), (
            f"{BACKENDS[backend].__name__}.{knob} defaults to {field!r}; the spec's {p} default is "
            f"{spec_default!r} (as params: {want!r})")


def test_every_known_mismatch_names_a_compared_pair():
    compared = {(b, k) for b, cls in BACKENDS.items() for k in set(_field_defaults(cls)) & set(SPEC.knobs)}
    assert set(KNOWN_MISMATCHES) <= compared, sorted(set(KNOWN_MISMATCHES) - compared)


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_params_fields_are_spec_knobs_or_declared_backend_local(backend):
    """A params field that is not a spec knob is declared as backend-only in the spec's
    ``backends.<name>.knobs``, so a misspelt or renamed knob cannot keep its own default silently."""
    local = set(SPEC.backend_knobs(backend))
    if backend == "tvm":
        assert set(DECODE_LOCAL_KNOBS) == local
    extra = set(_field_defaults(BACKENDS[backend])) - set(SPEC.knobs)
    assert extra == local, f"{BACKENDS[backend].__name__} fields outside the spec: {sorted(extra - local)}"


def test_triton_params_hold_every_spec_knob():
    """Every spec knob is a field of TritonParams or of the params class of a pass that reads it
    (``params_class("triton", pass_)``: a pass's own knobs live in its subclass)."""
    from pathtune.codegen._knobs import params_class

    held = set(_field_defaults(TritonParams))
    for pass_ in SPEC.passes:
        cls = params_class("triton", pass_)
        assert issubclass(cls, TritonParams)
        own = set(_field_defaults(cls)) - held
        assert own <= set(SPEC.passes[pass_].knobs), f"{cls.__name__} declares knobs its pass does not read: {own}"
        held |= own
    missing = set(SPEC.knobs) - held
    assert not missing, f"spec knobs no Triton params class holds: {sorted(missing)}"


@pytest.mark.parametrize("backend", sorted(BACKENDS))
@pytest.mark.parametrize("pass_", sorted(SPEC.passes))
def test_params_built_from_the_spec_default_are_the_class_default(backend, pass_):
    """``from_config(KnobSpace(spec, pass).default())`` (the spelling conversion and any adjustment in
    ``__post_init__`` included) gives the params of the class defaults."""
    cls = BACKENDS[backend]
    known = {k for b, k in KNOWN_MISMATCHES if b == backend} & set(SPACES[pass_].knobs)
    if known:
        pytest.xfail(f"known mismatches {sorted(known)}")
    assert cls.from_config(SPACES[pass_].default()) == cls()


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_beta_clip_eps_spelling(backend):
    """Every value of the spec's beta_clip_eps domain reaches the params: 'off' as None, a number as
    that float."""
    cls = BACKENDS[backend]
    for value in SPEC.knobs["beta_clip_eps"].domain:
        got = cls.from_config({"beta_clip_eps": value}).beta_clip_eps
        if value == "off":
            assert got is None
        else:
            assert isinstance(got, float) and got == float(value)
