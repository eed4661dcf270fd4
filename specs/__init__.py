"""pathtune.specs: the declarative PaTH attention spec, its schema, knob space and workload key.

>>> from pathtune.specs import load_spec, KnobSpace
>>> spec = load_spec()                      # the packaged path_attention.yaml
>>> KnobSpace(spec, "fwd").default()        # doctest: +ELLIPSIS
Config(beta_clip_eps='off', block_n=64, chunk_size=64, ...)
"""
from .canonical import canonical_json, dtype_name, sha256_hex
from .expr import Expr, ExprError
from .knobs import Config, KnobSpace, in_domain
from .loader import DEFAULT_SPEC, default_spec_path, load_spec, parse_spec_text
from .schema import PASS_NAMES, STAGE_KINDS, Knob, Rule, Spec, SpecError, TensorSpec
from .workload import KEY_SCHEMA, Workload, batch_bucket, seq_bucket

__all__ = [
    "Config", "KnobSpace", "in_domain",
    "load_spec", "parse_spec_text", "default_spec_path", "DEFAULT_SPEC",
    "Spec", "SpecError", "Knob", "Rule", "TensorSpec", "PASS_NAMES", "STAGE_KINDS",
    "Workload", "seq_bucket", "batch_bucket", "KEY_SCHEMA",
    "Expr", "ExprError",
    "canonical_json", "sha256_hex", "dtype_name",
]
