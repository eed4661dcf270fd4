"""Typed, frozen models of the PaTH attention spec (specs/path_attention.yaml).

Every model forbids unknown fields, so a typo fails instead of being ignored. Cross-references
(knob names in stages and constraints, dim symbols in shapes, tensor names in the numerics) are
checked when a spec is built. Problems are reported as a :class:`SpecError` that names the file,
the field path (``stages.fox_gate.placement``) and what is allowed.
"""
from __future__ import annotations

import difflib
import itertools
import json
import keyword
import math
import re
from functools import cached_property
from typing import Annotated, Any, Literal, Optional, Union

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PositiveInt,
    PrivateAttr,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from .canonical import canonical_json, sha256_hex
from .config import Config, in_domain
from .expr import Expr, ExprError

__all__ = [
    "SpecError", "Spec", "DimSpec", "Rule", "TensorSpec", "Tensors", "Knob", "PassSpec", "Numerics",
    "BetaClip", "Accuracy", "Variant", "BackendKnob", "HeadDimDefaults", "BackendSpec", "HouseholderChainStage",
    "UTInverseStage", "BlockwiseScanStage", "FoxGateStage", "Stage", "STAGE_KINDS", "PASS_NAMES", "DTYPE_NAMES",
]

DTypeName = Literal["bfloat16", "float16", "float32", "float64", "int32", "int64"]
DTYPE_NAMES: tuple[str, ...] = DTypeName.__args__  # type: ignore[attr-defined]
PassName = Literal["fwd", "bwd", "decode"]
PASS_NAMES: tuple[str, ...] = PassName.__args__  # type: ignore[attr-defined]
STAGE_KINDS = ("householder_chain", "ut_inverse", "blockwise_scan", "fox_gate")
REQUIRED_STAGE_KINDS = ("householder_chain", "ut_inverse", "blockwise_scan")
KnobScalar = Union[StrictBool, StrictInt, StrictFloat, StrictStr]

# Knob names become Config attributes and expression names, so they may not shadow either.
_RESERVED_KNOB_NAMES = frozenset(n for n in dir(Config) if not n.startswith("_")) | {"min", "max"}
# Upper bound on combinations tried when checking a constraint over its names' domains.
_MAX_CHECKED_COMBINATIONS = 200_000


class SpecError(ValueError):
    """An invalid spec. ``str(err)`` is a readable multi-line report; ``err.problems`` lists
    ``(field_path, message)`` pairs and ``err.source`` the file."""

    def __init__(self, source: str | None, problems: list[tuple[str, str]]) -> None:
        self.source = source or "<spec>"
        self.problems = problems
        head = f"invalid spec {self.source}: {len(problems)} problem{'s' if len(problems) != 1 else ''}"
        lines = [f"  {field}: {msg}" if field else f"  {msg}" for field, msg in problems]
        super().__init__("\n".join([head, *lines]))


# --------------------------------------------------------------------------------------------------
# Error plumbing: validators report (field, message) pairs through one custom pydantic error type,
# and SpecError.from_validation turns a pydantic ValidationError into field paths a person can read.

def _problems(*pairs: tuple[str, str]) -> PydanticCustomError:
    return PydanticCustomError("spec_problems", "{summary}",
                               {"summary": "; ".join(f"{f}: {m}" for f, m in pairs), "problems": list(pairs)})


def _join(*parts: Any) -> str:
    out = ""
    for p in parts:
        if p in ("", None):
            continue
        if isinstance(p, int):
            out += f"[{p}]"
        else:
            p = str(p)
            out += p if (not out or p.startswith("[")) else "." + p
    return out


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _format_pydantic_error(err: dict) -> list[tuple[str, str]]:
    loc = list(err.get("loc", ()))
    # A discriminated union puts the tag in the path (stages.x.fox_gate.placement): drop it.
    if len(loc) >= 3 and loc[0] == "stages" and loc[2] in STAGE_KINDS:
        del loc[2]
    path = _join(*loc)
    kind, ctx, value = err.get("type"), err.get("ctx") or {}, err.get("input")
    if kind == "spec_problems":
        return [(_join(path, field), msg) for field, msg in ctx["problems"]]
    if kind == "missing":
        return [(path, "required field is missing")]
    if kind == "union_tag_invalid":
        return [(_join(path, "kind"),
                 f"unknown stage kind {ctx.get('tag')!r}; allowed kinds: {', '.join(STAGE_KINDS)}")]
    if kind == "union_tag_not_found":
        return [(_join(path, "kind"), f"every stage needs a 'kind'; allowed kinds: {', '.join(STAGE_KINDS)}")]
    if kind == "literal_error":
        return [(path, f"{_short(value)} is not allowed; allowed: {ctx.get('expected')}")]
    if kind == "extra_forbidden":
        return [(path, "unknown field")]
    msg = err.get("msg", "invalid value")
    msg = msg[len("Value error, "):] if msg.startswith("Value error, ") else msg
    if isinstance(value, (dict, list)):
        return [(path, msg)]
    return [(path, f"{msg} (got {_short(value)})")]


def _spec_error_from_validation(exc: ValidationError, source: str | None) -> SpecError:
    problems: list[tuple[str, str]] = []
    for err in exc.errors(include_url=False):
        for pair in _format_pydantic_error(err):
            if pair not in problems:
                problems.append(pair)
    return SpecError(source, problems)


# --------------------------------------------------------------------------------------------------
# Models

class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _no_unknown_fields(cls, data: Any) -> Any:
        if isinstance(data, dict):
            allowed = list(cls.model_fields)
            pairs = []
            for key in data:
                if key not in cls.model_fields:
                    close = difflib.get_close_matches(str(key), allowed, n=1)
                    hint = f" (did you mean {close[0]!r}?)" if close else ""
                    pairs.append((str(key), f"unknown field{hint}; allowed fields: {', '.join(allowed)}"))
            if pairs:
                raise _problems(*pairs)
        return data


class Rule(_Model):
    """A condition (see specs/expr.py for the grammar) and the message shown when it is false."""

    expr: str
    message: str

    @field_validator("expr")
    @classmethod
    def _parses(cls, value: str) -> str:
        try:
            Expr.parse(value)
        except ExprError as e:
            raise ValueError(str(e)) from None
        return value

    @cached_property
    def compiled(self) -> Expr:
        return Expr.parse(self.expr)


class DimSpec(_Model):
    """A shape symbol. A ``domain`` lists the sizes kernels are built for (e.g. head dims)."""

    description: str = ""
    domain: Optional[tuple[StrictInt, ...]] = None

    @field_validator("domain")
    @classmethod
    def _domain(cls, value):
        if value is not None:
            if not value:
                raise ValueError("domain must list at least one size")
            bad = [v for v in value if v <= 0]
            if bad:
                raise ValueError(f"sizes must be positive, got {bad}")
            if len(set(value)) != len(value):
                raise ValueError(f"domain has duplicates: {list(value)}")
        return value


_INTERVAL = re.compile(r"^\s*([\(\[])\s*([-+0-9.eE]+|-inf)\s*,\s*([-+0-9.eE]+|inf)\s*([\)\]])\s*$")


class TensorSpec(_Model):
    """One argument or result of the op.

    Dtypes: either an explicit ``dtypes`` list (optionally extended by ``or_dtype_of: q``, "also
    accepted in q's dtype"), or ``same_dtype_as: q``.
    """

    role: Literal["input", "output"]
    shape: tuple[str, ...]
    dtypes: tuple[DTypeName, ...] = ()
    same_dtype_as: Optional[str] = None
    or_dtype_of: Optional[str] = None
    preferred_dtype: Optional[DTypeName] = None
    optional: bool = False
    unit_norm: bool = False
    interval: Optional[str] = None
    requires: tuple[Rule, ...] = ()
    notes: str = ""

    @field_validator("shape")
    @classmethod
    def _shape(cls, value):
        if not value:
            raise ValueError("shape must list at least one dim symbol")
        for i, entry in enumerate(value):
            try:
                Expr.parse(entry)
            except ExprError as e:
                raise ValueError(f"entry {i} {entry!r}: {e}") from None
        return value

    @field_validator("interval")
    @classmethod
    def _interval(cls, value):
        if value is not None:
            m = _INTERVAL.match(value)
            if not m:
                raise ValueError(f"{value!r} is not an interval; write it like '(0, 2]' or '[0, inf)'")
            lo, hi = float(m.group(2)), float(m.group(3))
            if not lo < hi:
                raise ValueError(f"{value!r} is empty (lower bound must be below upper bound)")
        return value

    @model_validator(mode="after")
    def _dtype_rule(self):
        pairs = []
        if self.same_dtype_as is not None and (self.dtypes or self.or_dtype_of):
            pairs.append(("same_dtype_as", "give either same_dtype_as, or dtypes (with an optional or_dtype_of), "
                                           "not both"))
        if self.same_dtype_as is None and not self.dtypes:
            pairs.append(("dtypes", "list the allowed dtypes, or give same_dtype_as: <tensor>; "
                                    f"dtype names: {', '.join(DTYPE_NAMES)}"))
        if self.preferred_dtype is not None and self.preferred_dtype not in self.dtypes:
            pairs.append(("preferred_dtype", f"{self.preferred_dtype!r} is not in dtypes {list(self.dtypes)}"))
        if pairs:
            raise _problems(*pairs)
        return self

    @property
    def interval_bounds(self) -> Optional[tuple[float, bool, float, bool]]:
        """``(low, low_inclusive, high, high_inclusive)`` or None."""
        if self.interval is None:
            return None
        m = _INTERVAL.match(self.interval)
        assert m is not None
        return float(m.group(2)), m.group(1) == "[", float(m.group(3)), m.group(4) == "]"

    @property
    def shape_exprs(self) -> tuple[Expr, ...]:
        return tuple(Expr.parse(s) for s in self.shape)


class Tensors(_Model):
    """The op's tensors. q, k, v, w, beta and o are required; g, cu_seqlens and lse are optional."""

    q: TensorSpec
    k: TensorSpec
    v: TensorSpec
    w: TensorSpec
    beta: TensorSpec
    o: TensorSpec
    g: Optional[TensorSpec] = None
    cu_seqlens: Optional[TensorSpec] = None
    lse: Optional[TensorSpec] = None

    def items(self) -> list[tuple[str, TensorSpec]]:
        return [(name, t) for name in type(self).model_fields if (t := getattr(self, name)) is not None]

    def names(self) -> list[str]:
        return [name for name, _ in self.items()]


_OPTIONAL_TENSORS = ("g", "cu_seqlens", "lse")


class Variant(_Model):
    """One way a stage can run (an algorithmic choice that changes which kernels run), and the passes
    it serves. Each backend registers its implementation of it, or the reason it has none."""

    passes: tuple[PassName, ...]
    description: str = Field("", exclude=True)   # documentation: not hashed

    @field_validator("passes")
    @classmethod
    def _passes(cls, value):
        if not value:
            raise ValueError("list the passes this variant serves (fwd, bwd, decode)")
        if len(set(value)) != len(value):
            raise ValueError(f"a pass is listed twice: {list(value)}")
        return value


class _Stage(_Model):
    # Documentation (the math, the conventions every backend follows): excluded from the spec hash,
    # since no kernel reads it and a field that can hold one value only selects nothing.
    description: str = Field("", exclude=True)
    doc: dict[str, str] = Field(default_factory=dict, exclude=True)
    variants: dict[str, Variant]

    @field_validator("variants")
    @classmethod
    def _variants(cls, value):
        if not value:
            raise ValueError("name at least one variant (how the stage runs) with the passes it serves")
        bad = [n for n in value if not n.isidentifier()]
        if bad:
            raise ValueError(f"variant names must be identifiers, got {bad}")
        return value


class HouseholderChainStage(_Stage):
    kind: Literal["householder_chain"]


class UTInverseStage(_Stage):
    kind: Literal["ut_inverse"]
    block_knob: str


class BlockwiseScanStage(_Stage):
    kind: Literal["blockwise_scan"]
    chunk_knob: str
    superchunk_knob: str
    key_tile_knob: str
    transition_precision_knob: str


class FoxGateStage(_Stage):
    kind: Literal["fox_gate"]
    optional: bool = True
    placement: Literal["inside_scale", "outside_scale"] = "inside_scale"

    @model_validator(mode="after")
    def _placement_is_a_variant(self):
        if self.placement not in self.variants:
            raise _problems(("placement", f"{self.placement!r} is not one of the stage's variants "
                                          f"({', '.join(self.variants)})"))
        return self


Stage = Annotated[Union[HouseholderChainStage, UTInverseStage, BlockwiseScanStage, FoxGateStage],
                  Field(discriminator="kind")]

# Stage fields that name knobs, and the knob type each must have.
_STAGE_KNOB_REFS = {
    "ut_inverse": {"block_knob": "int"},
    "blockwise_scan": {"chunk_knob": "int", "superchunk_knob": "int", "key_tile_knob": "int",
                       "transition_precision_knob": "categorical"},
}


class BetaClip(_Model):
    rule: str
    eps_knob: str
    applied_in: Literal["kernels"]
    reference_clips: bool = False
    notes: str = ""


class Accuracy(_Model):
    reference: Literal["float64"]
    metric: Literal["relative_frobenius"]
    tolerances: dict[str, Annotated[float, Field(gt=0, lt=1)]]


class Numerics(_Model):
    float32: tuple[str, ...]
    scan_precision_knob: str
    beta_clip: BetaClip
    accuracy: Accuracy


class Knob(_Model):
    """A tunable parameter: its type, the finite domain searched, and the default."""

    type: Literal["int", "float", "bool", "categorical"]
    domain: tuple[KnobScalar, ...]
    default: KnobScalar
    role: Literal["schedule", "precision", "semantics", "memory"] = "schedule"
    description: str = ""

    @model_validator(mode="before")
    @classmethod
    def _floats(cls, data: Any) -> Any:
        # A float knob may be written with integer literals (1 instead of 1.0).
        if isinstance(data, dict) and data.get("type") == "float":
            fix = lambda v: float(v) if type(v) is int else v  # noqa: E731
            data = dict(data)
            if isinstance(data.get("domain"), list):
                data["domain"] = [fix(v) for v in data["domain"]]
            if "default" in data:
                data["default"] = fix(data["default"])
        return data

    @model_validator(mode="after")
    def _consistent(self):
        pairs = []
        if not self.domain:
            raise _problems(("domain", "must list at least one value"))
        wanted = {"int": int, "float": float, "bool": bool}.get(self.type)
        for i, v in enumerate(self.domain):
            problem = _value_problem(v, self.type, wanted)
            if problem:
                pairs.append((f"domain[{i}]", problem))
        seen = []
        for v in self.domain:
            if in_domain(v, seen):
                pairs.append(("domain", f"{v!r} appears more than once"))
            seen.append(v)
        problem = _value_problem(self.default, self.type, wanted)
        if problem:
            pairs.append(("default", problem))
        elif not in_domain(self.default, self.domain):
            pairs.append(("default", f"{self.default!r} is not in the domain {list(self.domain)}"))
        if pairs:
            raise _problems(*pairs)
        return self


def _value_problem(value: Any, type_: str, wanted: Optional[type]) -> Optional[str]:
    if isinstance(value, bool) and type_ != "bool":
        return (f"{value!r} is a boolean, but this is a {type_} knob (YAML reads unquoted on/off/yes/no "
                f"as booleans: quote it, e.g. 'off')")
    if wanted is not None and type(value) is not wanted:
        article = "an" if type_ == "int" else "a"
        return f"{value!r} is a {type(value).__name__}, but {article} {type_} knob takes {wanted.__name__} values"
    return None


class BackendKnob(Knob):
    """A knob one backend reads beyond the spec's (``backends.<name>.knobs``), and the passes that read it."""

    passes: tuple[PassName, ...]


class HeadDimDefaults(_Model):
    """One row of a backend's untuned config: for max(D, DV) <= ``up_to`` (no ``up_to``: any larger head
    dim), the knobs that differ from the defaults."""

    up_to: Optional[PositiveInt] = None
    knobs: dict[str, KnobScalar]


class BackendSpec(_Model):
    """What one backend reads beyond the spec's knobs."""

    knobs: dict[str, BackendKnob] = {}
    head_dim_defaults: tuple[HeadDimDefaults, ...] = ()


class PassSpec(_Model):
    description: str = ""
    knobs: tuple[str, ...]


class Spec(_Model):
    """The whole spec. Build it with :func:`pathtune.specs.load_spec` (or ``Spec.from_dict``)."""

    name: str
    version: PositiveInt
    description: str
    dims: dict[str, DimSpec]
    dim_rules: tuple[Rule, ...] = ()
    tensors: Tensors
    stages: dict[str, Stage]
    numerics: Numerics
    knobs: dict[str, Knob]
    constraints: tuple[Rule, ...] = ()
    passes: dict[PassName, PassSpec]
    backends: dict[Literal["triton", "tvm"], BackendSpec] = {}

    _source: Optional[str] = PrivateAttr(default=None)
    _pass_hashes: dict[str, str] = PrivateAttr(default_factory=dict)

    # ---- construction -----------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, data: Any, source: Optional[str] = None) -> "Spec":
        """Validate parsed YAML/JSON; raises SpecError naming ``source`` and each bad field."""
        if not isinstance(data, dict):
            raise SpecError(source, [("", f"a spec is a mapping of fields, got {type(data).__name__}")])
        try:
            spec = cls.model_validate(data)
        except ValidationError as e:
            raise _spec_error_from_validation(e, source) from None
        spec._source = source
        return spec

    @classmethod
    def json_schema(cls) -> dict[str, Any]:
        """JSON Schema of the spec format (pydantic's ``model_json_schema``)."""
        return cls.model_json_schema()

    # ---- cross-field checks ------------------------------------------------------------------------
    @model_validator(mode="after")
    def _cross_references(self):
        pairs: list[tuple[str, str]] = []
        pairs += self._check_dims()
        pairs += self._check_tensors()
        pairs += self._check_knob_names()
        pairs += self._check_stages()
        pairs += self._check_numerics()
        pairs += self._check_passes()
        # The defaults check reads every pass's knobs: only meaningful when all else is intact.
        pairs += self._check_constraints(check_defaults=not pairs)
        if not pairs:
            pairs += self._check_backends()
        if pairs:
            raise _problems(*pairs)
        return self

    def _check_dims(self) -> list[tuple[str, str]]:
        pairs = []
        for name in self.dims:
            if not name.isidentifier() or keyword.iskeyword(name) or name in ("min", "max"):
                pairs.append((f"dims.{name}", "dim names must be identifiers (and not min/max)"))
        for name in ("D", "DV"):
            if name not in self.dims:
                pairs.append((f"dims.{name}", "required dim is missing (head dims of q/k/w and v/o)"))
            elif self.dims[name].domain is None:
                pairs.append((f"dims.{name}.domain", "required: the head dims kernels are built for"))
        for i, rule in enumerate(self.dim_rules):
            unknown = sorted(rule.compiled.names - set(self.dims))
            if unknown:
                pairs.append((f"dim_rules[{i}].expr", _unknown_names(unknown, self.dims)))
        return pairs

    def _check_tensors(self) -> list[tuple[str, str]]:
        pairs = []
        names = self.tensors.names()
        for tname, t in self.tensors.items():
            for i, e in enumerate(t.shape_exprs):
                unknown = sorted(e.names - set(self.dims))
                if unknown:
                    pairs.append((f"tensors.{tname}.shape[{i}]", _unknown_names(unknown, self.dims)))
            for field in ("same_dtype_as", "or_dtype_of"):
                ref = getattr(t, field)
                if ref is not None and (ref not in names or ref == tname):
                    pairs.append((f"tensors.{tname}.{field}", f"{ref!r} is not another tensor of the spec; "
                                                              f"tensors: {', '.join(names)}"))
                elif ref is not None and getattr(self.tensors, ref).same_dtype_as is not None:
                    pairs.append((f"tensors.{tname}.{field}", f"{ref!r} must list its own dtypes (no chains)"))
            if t.optional != (tname in _OPTIONAL_TENSORS):
                why = ("path_attention takes it as an optional argument" if tname in _OPTIONAL_TENSORS
                       else "path_attention always needs it")
                pairs.append((f"tensors.{tname}.optional", f"must be {tname in _OPTIONAL_TENSORS} ({why})"))
            for i, rule in enumerate(t.requires):
                unknown = sorted(rule.compiled.names - set(self.dims))
                if unknown:
                    pairs.append((f"tensors.{tname}.requires[{i}].expr", _unknown_names(unknown, self.dims)))
        return pairs

    def _check_knob_names(self) -> list[tuple[str, str]]:
        pairs = []
        for name in self.knobs:
            if not name.isidentifier() or keyword.iskeyword(name) or name.startswith("_"):
                pairs.append((f"knobs.{name}", "knob names must be identifiers not starting with '_'"))
            elif name in _RESERVED_KNOB_NAMES:
                pairs.append((f"knobs.{name}", f"{name!r} is reserved (a Config attribute or expression "
                                               f"function); pick another name"))
            elif name in self.dims:
                pairs.append((f"knobs.{name}", f"{name!r} is also a dim name; knob and dim names must differ"))
        return pairs

    def _knob_ref(self, field: str, ref: str, type_: Optional[str]) -> list[tuple[str, str]]:
        if ref not in self.knobs:
            return [(field, _unknown_names([ref], self.knobs, what="knob"))]
        if type_ is not None and self.knobs[ref].type != type_:
            return [(field, f"knob {ref!r} has type {self.knobs[ref].type}, expected {type_}")]
        return []

    def _check_stages(self) -> list[tuple[str, str]]:
        pairs = []
        kinds = [s.kind for s in self.stages.values()]
        for kind in STAGE_KINDS:
            count = kinds.count(kind)
            if count > 1:
                pairs.append(("stages", f"stage kind {kind!r} appears {count} times; at most once"))
            elif count == 0 and kind in REQUIRED_STAGE_KINDS:
                pairs.append(("stages", f"a stage of kind {kind!r} is required "
                                        f"(required kinds: {', '.join(REQUIRED_STAGE_KINDS)})"))
        for sname, stage in self.stages.items():
            for field, type_ in _STAGE_KNOB_REFS.get(stage.kind, {}).items():
                pairs += self._knob_ref(f"stages.{sname}.{field}", getattr(stage, field), type_)
        return pairs

    def _check_numerics(self) -> list[tuple[str, str]]:
        pairs = []
        known = self.tensors.names() + list(self.stages)
        for i, name in enumerate(self.numerics.float32):
            if name not in known:
                pairs.append((f"numerics.float32[{i}]", _unknown_names([name], known, what="tensor or stage")))
        pairs += self._knob_ref("numerics.scan_precision_knob", self.numerics.scan_precision_knob, "categorical")
        pairs += self._knob_ref("numerics.beta_clip.eps_knob", self.numerics.beta_clip.eps_knob, None)
        outputs = [n for n, t in self.tensors.items() if t.role == "output"]
        grads = [f"d{n}" for n, t in self.tensors.items()
                 if t.role == "input" and not set(t.dtypes) & {"int32", "int64"}]
        for key in self.numerics.accuracy.tolerances:
            if key not in outputs + grads:
                pairs.append((f"numerics.accuracy.tolerances.{key}",
                              f"not an output or input gradient; allowed: {', '.join(outputs + grads)}"))
        return pairs

    def _check_passes(self) -> list[tuple[str, str]]:
        pairs = []
        for p in PASS_NAMES:
            if p not in self.passes:
                pairs.append((f"passes.{p}", "required pass is missing"))
        for pname, p in self.passes.items():
            for i, name in enumerate(p.knobs):
                if name not in self.knobs:
                    pairs.append((f"passes.{pname}.knobs[{i}]", _unknown_names([name], self.knobs, what="knob")))
                elif p.knobs.index(name) != i:
                    pairs.append((f"passes.{pname}.knobs[{i}]", f"{name!r} is listed twice"))
        used = {n for p in self.passes.values() for n in p.knobs}
        for name in self.knobs:
            if name not in used:
                pairs.append((f"knobs.{name}", "no pass uses it; add it to passes.<fwd|bwd|decode>.knobs"))
        return pairs

    def _check_constraints(self, check_defaults: bool) -> list[tuple[str, str]]:
        pairs = []
        tuning_dims = {n: d.domain for n, d in self.dims.items() if d.domain is not None}
        allowed = sorted(self.knobs) + sorted(tuning_dims)
        for i, rule in enumerate(self.constraints):
            field = f"constraints[{i}].expr"
            names = rule.compiled.names
            unknown = sorted(names - set(allowed))
            if unknown:
                pairs.append((field, _unknown_names(unknown, allowed, what="knob or workload dim") +
                              f" (in {rule.expr!r})"))
                continue
            knob_names = names & set(self.knobs)
            if not any(knob_names <= set(p.knobs) for p in self.passes.values()):
                where = "; ".join(f"{n} in {', '.join(self.knob_passes(n))}" for n in sorted(knob_names))
                pairs.append((field, f"its knobs never meet in one pass ({where}), so it would never be checked"))
                continue
            # Evaluate over every combination of its names' domains: catches non-boolean
            # expressions and type errors (e.g. 'off' < 0.01) now rather than in the tuner.
            ordered = sorted(names)
            domains = [self.knobs[n].domain if n in self.knobs else tuning_dims[n] for n in ordered]
            if math.prod(len(d) for d in domains) > _MAX_CHECKED_COMBINATIONS:
                continue
            for values in itertools.product(*domains):
                try:
                    rule.compiled.evaluate_bool(dict(zip(ordered, values)))
                except ExprError as e:
                    env = ", ".join(f"{n}={v!r}" for n, v in zip(ordered, values))
                    pairs.append((field, f"{e} (for {env})"))
                    break
        if pairs or not check_defaults:
            return pairs
        # Each pass's defaults must be valid for every supported head dim: they are the fallback.
        for pname in self.passes:
            defaults = {n: self.knobs[n].default for n in self.passes[pname].knobs}
            for rule in self.constraints_for(pname):
                dim_names = sorted(rule.compiled.names & set(tuning_dims))
                for dims in itertools.product(*(tuning_dims[n] for n in dim_names)):
                    env = {**defaults, **dict(zip(dim_names, dims))}
                    if not rule.compiled.evaluate_bool(env):
                        i = self.constraints.index(rule)
                        at = ", ".join(f"{n}={v}" for n, v in zip(dim_names, dims))
                        pairs.append((f"constraints[{i}]", f"the {pname} knob defaults violate it"
                                                           f"{' for ' + at if at else ''}: {rule.message}; "
                                                           "change a default or the constraint"))
                        break
        return pairs

    def _check_backends(self) -> list[tuple[str, str]]:
        pairs = []
        tuning_dims = {n: d.domain for n, d in self.dims.items() if d.domain is not None}
        widest = max(max(self.head_dims), max(self.head_dims_v))
        for bname, b in self.backends.items():
            where = f"backends.{bname}"
            for name in b.knobs:
                if name in self.knobs or name in self.dims or not name.isidentifier() or name.startswith("_"):
                    pairs.append((f"{where}.knobs.{name}", "a backend knob needs its own identifier name (not a spec "
                                                           "knob or dim, not starting with '_')"))
            known = {**self.knobs, **b.knobs}
            previous = 0
            for i, row in enumerate(b.head_dim_defaults):
                field = f"{where}.head_dim_defaults[{i}]"
                if row.up_to is None and i != len(b.head_dim_defaults) - 1:
                    pairs.append((f"{field}.up_to", "only the last row may leave out up_to (it takes every larger "
                                                    "head dim)"))
                elif row.up_to is not None and row.up_to <= previous:
                    pairs.append((f"{field}.up_to", f"rows go by increasing up_to; {row.up_to} follows {previous}"))
                previous = row.up_to or previous
                for name, value in row.knobs.items():
                    if name not in known:
                        pairs.append((f"{field}.knobs.{name}", _unknown_names([name], known, what="knob")))
                    elif not in_domain(value, known[name].domain):
                        pairs.append((f"{field}.knobs.{name}", f"{value!r} is not in the domain "
                                                               f"{list(known[name].domain)}"))
            last = b.head_dim_defaults[-1].up_to if b.head_dim_defaults else None
            if b.head_dim_defaults and last is not None and last < widest:
                pairs.append((f"{where}.head_dim_defaults", f"the rows end at head dim {last}; the spec's head dims "
                                                            f"go to {widest} (leave out the last row's up_to)"))
        if pairs:
            return pairs
        # Each row's config must satisfy every pass's constraints at the head dims it covers.
        for bname, b in self.backends.items():
            for i, row in enumerate(b.head_dim_defaults):
                for pname in self.passes:
                    config = {n: row.knobs.get(n, self.knobs[n].default) for n in self.passes[pname].knobs}
                    for rule in self.constraints_for(pname):
                        dim_names = sorted(rule.compiled.names & set(tuning_dims))
                        for dims in itertools.product(*(tuning_dims[n] for n in dim_names)):
                            env = {**config, **dict(zip(dim_names, dims))}
                            D, DV = env.get("D"), env.get("DV")
                            if self._head_dim_row(bname, D or 0, DV) is not row and (D or DV):
                                continue
                            if not rule.compiled.evaluate_bool(env):
                                at = ", ".join(f"{n}={v}" for n, v in zip(dim_names, dims))
                                pairs.append((f"backends.{bname}.head_dim_defaults[{i}]",
                                              f"its {pname} config violates a constraint"
                                              f"{' at ' + at if at else ''}: {rule.message}"))
                                break
        return pairs

    # ---- queries ------------------------------------------------------------------------------------
    @property
    def source(self) -> Optional[str]:
        """The file this spec was loaded from (None when built from a dict)."""
        return self._source

    @cached_property
    def canonical_json(self) -> str:
        """The spec's content as canonical JSON, without its documentation fields and without the backends'
        untuned configs (``head_dim_defaults``): a record stores every knob value it ran with, so which
        config the runtime falls back to where no record exists changes no measurement's meaning."""
        untuned = {name: {"head_dim_defaults"} for name in self.backends}
        return canonical_json(self.model_dump(mode="json", exclude={"backends": untuned} if untuned else None))

    @cached_property
    def hash(self) -> str:
        """sha256 (hex) of the canonical JSON of the spec (``canonical_json``)."""
        return sha256_hex(self.canonical_json)

    def pass_canonical_json(self, pass_: str) -> str:
        """The canonical JSON that :meth:`pass_hash` hashes: ``{"pass": pass_, "spec": <reduced spec>}``,
        where the reduced spec is ``canonical_json``'s content less what belongs only to other passes:

        * ``knobs``: the knobs ``passes.<pass_>.knobs`` lists (a knob shared with other passes stays);
        * ``passes``: this pass's entry only;
        * ``constraints``: those ``constraints_for(pass_)`` applies (all their knobs in this pass; a rule
          over workload dims only applies to every pass), in spec order;
        * ``stages``: each stage's variants that serve this pass, their ``passes`` cut to this pass; a
          stage with no such variant is left out;
        * ``backends.<name>.knobs``: the backend knobs this pass reads, their ``passes`` cut to this pass.

        Everything else (name, version, description, dims, dim rules, tensors, numerics with the
        tolerances, the other fields of the stages and knobs) stays as it is in the full spec.
        """
        if pass_ not in self.passes:
            raise ValueError(f"unknown pass {pass_!r}; passes: {', '.join(self.passes)}")
        full = json.loads(self.canonical_json)
        mine = set(self.passes[pass_].knobs)
        full["knobs"] = {n: k for n, k in full["knobs"].items() if n in mine}
        full["passes"] = {pass_: full["passes"][pass_]}
        kept = {id(rule) for rule in self.constraints_for(pass_)}
        full["constraints"] = [c for rule, c in zip(self.constraints, full["constraints"]) if id(rule) in kept]
        stages = {}
        for sname, stage in full["stages"].items():
            variants = {v: {**d, "passes": [pass_]} for v, d in stage["variants"].items() if pass_ in d["passes"]}
            if variants:
                stages[sname] = {**stage, "variants": variants}
        full["stages"] = stages
        for backend in full.get("backends", {}).values():
            backend["knobs"] = {n: {**k, "passes": [pass_]} for n, k in backend.get("knobs", {}).items()
                                if pass_ in k["passes"]}
        return canonical_json({"pass": pass_, "spec": full})

    def pass_hash(self, pass_: str) -> str:
        """sha256 (hex) of the spec reduced to what concerns ``pass_`` (``pass_canonical_json``): what the
        records, caches and studies of that pass carry, so that adding or changing a knob, constraint or
        stage variant of one pass leaves the other passes' hashes (and their measurements) as they are.
        A change to anything every pass reads (dims, tensors, numerics, a shared knob) changes the hash
        of each pass that reads it. Deterministic: a function of the spec's content only."""
        cached = self._pass_hashes.get(pass_)
        if cached is None:
            cached = self._pass_hashes[pass_] = sha256_hex(self.pass_canonical_json(pass_))
        return cached

    def hashes_of(self, pass_: str) -> tuple[str, ...]:
        """The spec hashes that name this spec for ``pass_``: what a record or built module of that pass may carry
        and still be this spec's -- the pass hash (everything made since per-pass hashes) and the full hash (made
        before); just the full hash for a name that is not one of the spec's passes."""
        if pass_ not in self.passes:
            return (self.hash,)
        return (self.pass_hash(pass_), self.hash)

    @property
    def pass_hashes(self) -> dict[str, str]:
        """``{pass: pass_hash(pass)}`` for every pass of the spec."""
        return {p: self.pass_hash(p) for p in self.passes}

    @property
    def head_dims(self) -> tuple[int, ...]:
        """Supported head dims D of q, k, w (the D domain)."""
        return tuple(self.dims["D"].domain or ())

    @property
    def head_dims_v(self) -> tuple[int, ...]:
        """Supported head dims DV of v, o (the DV domain)."""
        return tuple(self.dims["DV"].domain or ())

    @property
    def gate_placement(self) -> str:
        """Where the FoX bias enters the logits: the fox_gate stage's placement ("inside_scale" without one)."""
        gate = self.stage("fox_gate")
        return gate.placement if gate is not None else "inside_scale"

    def _head_dim_row(self, backend: str, head_dim: int, head_dim_v: Optional[int]) -> Optional[HeadDimDefaults]:
        b = self.backends.get(backend)
        if b is None:
            return None
        d = max(head_dim, head_dim_v or head_dim)
        return next((r for r in b.head_dim_defaults if r.up_to is None or d <= r.up_to), None)

    def head_dim_defaults(self, backend: str, head_dim: int, head_dim_v: Optional[int] = None) -> dict[str, Any]:
        """The knobs of ``backend``'s untuned config that differ from the defaults at these head dims
        (``backends.<backend>.head_dim_defaults``; keyed by max(D, DV)); {} without a table."""
        row = self._head_dim_row(backend, head_dim, head_dim_v)
        return dict(row.knobs) if row is not None else {}

    def backend_knobs(self, backend: str, pass_: Optional[str] = None) -> dict[str, "BackendKnob"]:
        """The knobs ``backend`` reads beyond the spec's (of one pass, or of any)."""
        b = self.backends.get(backend)
        if b is None:
            return {}
        return {n: k for n, k in b.knobs.items() if pass_ is None or pass_ in k.passes}

    def backend_defaults(self, backend: str, head_dim: Optional[int] = None,
                         head_dim_v: Optional[int] = None) -> dict[str, Any]:
        """Every knob ``backend`` may read, in the spec's spelling: the spec's and the backend's own knob
        defaults, overlaid with its head-dim defaults when ``head_dim`` is given."""
        out = {n: k.default for n, k in self.knobs.items()}
        out.update({n: k.default for n, k in self.backend_knobs(backend).items()})
        if head_dim is not None:
            out.update(self.head_dim_defaults(backend, head_dim, head_dim_v))
        return out

    def stage(self, kind: str) -> Optional[Stage]:
        """The stage of a kind, or None when the spec has none (only fox_gate may be absent)."""
        if kind not in STAGE_KINDS:
            raise ValueError(f"unknown stage kind {kind!r}; kinds: {', '.join(STAGE_KINDS)}")
        return next((s for s in self.stages.values() if s.kind == kind), None)

    def knob_passes(self, name: str) -> tuple[str, ...]:
        """The passes that use a knob."""
        return tuple(p for p, spec in self.passes.items() if name in spec.knobs)

    def constraints_for(self, pass_: str) -> tuple[Rule, ...]:
        """Constraints whose knobs all belong to ``pass_``."""
        knobs = set(self.passes[pass_].knobs)
        return tuple(c for c in self.constraints if c.compiled.names & set(self.knobs) <= knobs)


def _unknown_names(unknown: list[str], known: Any, what: str = "dim") -> str:
    known = sorted(known)
    parts = []
    for name in unknown:
        close = difflib.get_close_matches(name, known, n=1)
        parts.append(f"{name!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
    return f"unknown {what} {', '.join(parts)}; known: {', '.join(known)}"
