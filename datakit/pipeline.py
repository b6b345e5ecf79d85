"""`Pipeline`: the fluent builder and the YAML file format are the same pydantic object.

Why one object for both: an operator's scheduled YAML and a researcher's script
must mean exactly the same thing, be validated the same way, and round-trip
(`p.to_yaml(path)`, then `Pipeline.from_yaml(path) == p`: the same stages, with every local path
meaning the same file wherever the YAML was saved). The file format is a public contract
(documented in `schemas/pipeline.v1.json`): keep it stable.

    name: quickstart
    seed: 0
    input:  {path: "logs/**/*.jsonl.zst", format: jsonl, schema: editor_event.v1}
    stages:
      - {kind: ingest}
      - {kind: consent, optouts: "optouts.parquet"}
      - {kind: extract, kinds: [code, fim, sft]}
    output: {path: "out/", format: parquet, shards: 4}
"""
from __future__ import annotations

import copy
import inspect
import json
import logging
import os
import time
from pathlib import Path
from typing import Any, Literal, Sequence

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from datakit import contracts
from datakit.errors import DatakitError
from datakit.io.fs import EMPTY_PATH, InputError, expand, from_cwd
from datakit.io.url_secrets import hide_url_secrets
from datakit.plan import ByValue, MapBatches, Plan, Rel, SinkSpec, StageSpan, source
from datakit.stages.base import CompileContext, StageConfig, spelled_kind, stage_class

log = logging.getLogger("datakit.pipeline")



class DuplicateKeyError(yaml.YAMLError):
    """A key given twice in one YAML mapping (`load_yaml`)."""


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a key given twice in one mapping (see `load_yaml`)."""


def _unique_key_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen: dict[Any, yaml.Mark] = {}
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *base`: its keys may be overridden, as YAML says
            continue
        key = loader.construct_object(key_node, deep=True)
        try:
            first = seen.get(key)
        except TypeError:  # an unhashable key: the base constructor says what is wrong with it
            continue
        if first is not None:
            raise DuplicateKeyError(f"line {key_node.start_mark.line + 1}: key {key!r} is given twice in one mapping "
                                    f"(first on line {first.line + 1}); the second would silently replace the first")
        seen[key] = key_node.start_mark
    return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _unique_key_mapping)


def load_yaml(text: str) -> Any:
    """`yaml.safe_load`, except that a key given twice in one mapping is an error.

    Why: found in a hostile-input review, a pipeline file with `stages:` twice ran the second list
    without a word; the first held `scrub_pii`, so e-mail addresses reached the output. Typos and
    unknown keys were already refused; a repeated key is the same mistake."""
    return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass

class PipelineError(DatakitError, ValueError):
    """A pipeline file or builder call is invalid; the message names file, stage and field."""


class InputConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    path: str | list[str]
    format: Literal["jsonl", "parquet"] = "jsonl"
    schema_name: str = Field("editor_event.v1", alias="schema")

    @field_validator("path")
    @classmethod
    def _some_path(cls, v: str | list[str]) -> str | list[str]:
        """Found in a Python API review: `input([])` committed an empty dataset (a glob that matches
        nothing is an error), and `input("")` read every file below the current folder."""
        if isinstance(v, list) and not v:
            raise ValueError("no input path given (an empty list)")
        if any(not p.strip() for p in ([v] if isinstance(v, str) else v)):
            raise ValueError(EMPTY_PATH)
        return v


class OutputConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    path: str
    format: str = "parquet"
    shards: int | Literal["auto"] = 1
    rows_per_shard: int = Field(100_000, gt=0, description="with shards: auto")
    key: str | None = None  # default: doc_id for records, event_id for events
    mode: Literal["overwrite", "append"] = Field(
        "overwrite", description="overwrite: each run replaces the dataset; append: each run adds (or replaces) "
                                 "one snapshot of a dataset of snapshots (schemas/output_layout.md, docs/scheduling.md)")
    index: bool = Field(False, description="emit an n-gram index (_ngram_index/) beside the output, so "
                                           "`datakit contamination-check` of a new eval takes seconds")
    quality: bool | str = Field(False, description="great-expectations suites inside the run: true = after every "
                                                    "stage the shipped suites whose `after` names its kind; NAME = that "
                                                    "suite after the last stage (docs/quality.md)")

    @field_validator("path")
    @classmethod
    def _some_path(cls, v: str) -> str:
        """Found in a Python API review: `output("")` ran every stage, wrote nothing and returned success."""
        if not v.strip():
            raise ValueError("an empty path names no folder to write the dataset into (an unset variable?)")
        return v

    @field_validator("format")
    @classmethod
    def _known_format(cls, v: str) -> str:
        from datakit.io.sinks import known_formats

        if v not in known_formats():  # found at load, not after every stage has run
            raise ValueError(f"unknown output format {v!r}; known: {', '.join(known_formats())}")
        return v

    @field_validator("shards")
    @classmethod
    def _positive_shards(cls, v: int | str) -> int | str:
        if isinstance(v, int) and v < 1:
            raise ValueError(f"shards must be a positive number or 'auto' (got {v})")
        return v

    @model_validator(mode="after")
    def _index_of_a_readable_format(self) -> "OutputConfig":
        # found in review: `format: megatron, index: true` wrote and committed the whole dataset, then failed
        # (exit 2) telling the user to pass a --text-field `run` does not have; the index reads records or
        # packed sequences only
        if self.index and self.format not in ("parquet", "packed"):
            raise ValueError(f"index: true needs format parquet or packed (the n-gram index reads records or "
                             f"packed sequences; {self.format!r} is neither): index the record-level dataset instead")
        return self
    mds_size_limit: int | None = Field(None, gt=0, lt=4 << 30,
                                       description="format mds: the largest MDS file in bytes (default 64 MiB, "
                                                   "MDSWriter's size_limit); below 4 GiB (u32 offsets)")
    allow_unmasked: bool = Field(False, description="write records whose tokens are partly without loss (SFT, "
                                                    "editor FIM) to a format whose standard readers ignore loss "
                                                    "masks (megatron); off = a compile-time error")


# record kinds whose every token carries loss (code, incl. FIM-transformed code); preference pairs go to
# Parquet, where trainers mask the prompt themselves
_FULL_LOSS_KINDS = {"code", "preference"}


def _dedup_before(stages: Sequence[Any]) -> int | None:
    """The index of the last `dedup` stage among `stages`, or None."""
    return next((i for i in range(len(stages) - 1, -1, -1) if stages[i].kind == "dedup"), None)


def _extract_kinds(cfg: "PipelineConfig") -> set[str] | None:
    """The record kinds the pipeline's extract stage makes (None: records come in as input, kinds unknown)."""
    extract = next((s for s in cfg.stages if s.kind == "extract"), None)
    return set(getattr(extract, "kinds", None) or []) if extract is not None else None


def _where_raised(e: BaseException) -> str:
    """` (at file.py:LINE in fn)`: the innermost frame of `e`'s traceback, for a one-line error."""
    tb = e.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is None:
        return ""
    code = tb.tb_frame.f_code
    return f" (at {Path(code.co_filename).name}:{tb.tb_lineno} in {code.co_name})"


def _check_loss_masks(cfg: "PipelineConfig", fmt: str) -> None:
    """Refuse, at compile time, masked training data for a format that cannot carry the masks to the trainer.

    Why: Megatron's standard GPTDataset reads only the token files; our loss-mask side files would be
    ignored and every SFT prompt token trained on, silently. Kinds are known from the extract stage;
    with records as input (no extract stage) they are unknown, so masked data is assumed.
    """
    from datakit.io.sinks import writer_for

    if getattr(writer_for(fmt), "carries_loss_mask", True) or not any(s.kind == "tokenize" for s in cfg.stages):
        return
    kinds = _extract_kinds(cfg)
    masked = sorted(kinds - _FULL_LOSS_KINDS) if kinds is not None else ["sft", "fim (records input)"]
    if masked:
        raise PipelineError(
            f"{cfg.name}: output format {fmt!r} cannot carry loss masks to a trainer (its standard reader "
            f"ignores them), but {', '.join(masked)} records train only some tokens; use format: packed, or set "
            f"output.allow_unmasked: true to write them anyway (masks then only in data/loss_mask-*)")


class PipelineConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = "pipeline"
    # 0 <= seed < 2^64: the seed is folded into 64-bit hashes, so a wider one repeated another's data under
    # another pipeline hash (found in a Python API review: 0, 2^64 and 2^70 gave the same bytes)
    seed: int = Field(0, ge=0, lt=2**64)
    input: InputConfig | None = None
    stages: list[StageConfig] = Field(default_factory=list)
    output: OutputConfig | None = None
    spark: dict[str, Any] = Field(default_factory=dict, description="Spark conf passed to the session")

    @field_validator("spark")
    @classmethod
    def _flat_spark_conf(cls, v: dict[str, Any]) -> dict[str, Any]:
        """Spark settings are KEY: scalar (found in review: a nested mapping ran, recorded in the run
        report, and reached Spark as its Python text)."""
        for k, x in v.items():
            if not isinstance(x, (str, int, float, bool)):
                raise ValueError(f"{k}: a Spark setting takes a string, number or boolean (got {type(x).__name__}); "
                                 "write nested keys in full, e.g. spark.executor.memory: 4g")
        return v


def _format_errors(e: ValidationError, where: str, model: type[BaseModel] | None = None) -> str:
    parts = []
    for err in e.errors():
        loc = ".".join(str(x) for x in err["loc"])
        hint = _did_you_mean(model, err["loc"]) if err.get("type") == "extra_forbidden" and model else ""
        parts.append(f"{where}: field {loc or '(root)'}: {err['msg']}{hint}")
    return "; ".join(parts)


def _did_you_mean(model: type[BaseModel], loc: tuple) -> str:
    """`(did you mean 'threshold'?)` for an unknown field `loc[-1]` of the model at `loc[:-1]` (found in a
    docs review: `minhash: {treshold: 0.8}` said only "Extra inputs are not permitted")."""
    import difflib
    import typing

    for part in loc[:-1]:
        field = model.model_fields.get(str(part)) if isinstance(part, str) else None
        if field is None:
            return ""
        inner = [a for a in (field.annotation, *typing.get_args(field.annotation))
                 if isinstance(a, type) and issubclass(a, BaseModel)]
        if not inner:
            return ""
        model = inner[0]
    names = [n for n in model.model_fields] + [f.alias for f in model.model_fields.values() if f.alias]
    close = difflib.get_close_matches(str(loc[-1]), names, n=1, cutoff=0.6)
    if close:
        return f" (did you mean {close[0]!r}?)"
    # a setting of a nested block given one level up (found in review: `{kind: dedup, treshold: 0.8}` got no
    # hint, the same typo under `minhash:` did): `minhash.threshold`
    nested = {}
    for name, field in model.model_fields.items():
        for a in (field.annotation, *typing.get_args(field.annotation)):
            if isinstance(a, type) and issubclass(a, BaseModel):
                nested.update({f"{name}.{n}": n for n in a.model_fields})
    close = difflib.get_close_matches(str(loc[-1]), list(nested.values()), n=1, cutoff=0.6)
    where = next((k for k, v in nested.items() if close and v == close[0]), None)
    return f" (did you mean {where!r}, inside {where.split('.')[0]!r}?)" if where else ""


def _check_columns(where: str, verb: str, columns: tuple[str, ...], schema: Any, why: str) -> None:
    """A stage's declared columns against the schema it gets (reads) or makes (writes): one line naming both."""
    for c in columns:
        if c not in schema.names:
            raise PipelineError(f"{where}: {verb} column {c!r}, but {why} (columns: {', '.join(schema.names)})")


def _input_inside(files: list[str], out: str) -> str | None:
    """The first input file that lies inside the output folder `out` (links resolved), else None.

    Why: an input glob that also matches the output (`--input 'in/**' --output in/o3`) read the
    previous run's files; the second run first withdrew the published dataset and then failed on a
    file it had listed ("disappeared"), so the earlier output was lost (found in review).

    Both sides are compared as their filesystem sees them (storage, then the path without its protocol),
    not as typed: found in an operations review, `--output file:///data/in/out` over input `/data/in`, or
    `--output s3a://b/in/out` over input `s3://b/in`, passed, and the second run lost the first's output."""
    from datakit.io.fs import filesystem

    def storage_of(fs) -> str:
        protocols = (fs.protocol,) if isinstance(fs.protocol, str) else tuple(fs.protocol)
        return "local" if {"file", "local"} & set(protocols) else sorted(protocols)[0]  # s3 and s3a: one store

    def where(fs, path: str) -> str:
        return os.path.realpath(path) if storage_of(fs) == "local" else path

    out_fs, out_path = filesystem(out)
    store, root = storage_of(out_fs), where(out_fs, out_path).rstrip("/") + "/"
    by_protocol: dict[str, Any] = {}  # one filesystem per protocol: a listing can hold many files
    for f in files:
        protocol = f.split("://", 1)[0] if "://" in f else ""
        if protocol not in by_protocol:
            by_protocol[protocol] = filesystem(f)[0]
        fs = by_protocol[protocol]
        if storage_of(fs) != store:
            continue
        path = fs._strip_protocol(f) if protocol else filesystem(f)[1]
        if where(fs, path).startswith(root):
            return f
    return None


def parse_stage(spec: dict[str, Any] | StageConfig, where: str = "") -> StageConfig:
    """A stage config from a dict (YAML) or an existing config, with a precise error."""
    if isinstance(spec, StageConfig):
        return spec
    if not isinstance(spec, dict) or "kind" not in spec:
        raise PipelineError(f"{where}: a stage needs a 'kind' (got {type(spec).__name__})")
    try:
        cls = stage_class(spec["kind"])
    except KeyError as e:
        raise PipelineError(f"{where}: {e.args[0]}") from None
    kind = cls.model_fields["kind"].default
    if spec["kind"] != kind:  # loaded by module path (`pkg.mod:Class`): the config carries the class's own kind
        spec = {**spec, "kind": kind}
    try:
        return cls.model_validate(spec)
    except ValidationError as e:
        raise PipelineError(_format_errors(e, f"{where} ({spec['kind']})", cls)) from None


def _built(model: type[BaseModel], where: str, **fields: Any) -> Any:
    """`model(**fields)`, a `PipelineError` naming the field when they do not validate (found in review: the
    builder raised pydantic's multi-line ValidationError where `.add()` and `from_yaml` raise one line)."""
    try:
        return model(**fields)
    except ValidationError as e:
        raise PipelineError(_format_errors(e, where, model)) from None


class Pipeline:
    """Build, load, save and run a pipeline.

    >>> p = (Pipeline("demo", seed=0)
    ...      .input("logs/**/*.jsonl.zst")
    ...      .add({"kind": "ingest"}).add({"kind": "extract", "kinds": ["code"]})
    ...      .output("out/", shards=2))
    >>> result = p.run()          # local engine; result.stages has the counts
    """

    def __init__(self, name: str = "pipeline", seed: int = 0, *, base_dir: str | Path | None = None) -> None:
        self.config = _built(PipelineConfig, "pipeline", name=name, seed=seed)
        if base_dir is not None and not isinstance(base_dir, (str, os.PathLike)):  # found in a Python API review:
            raise PipelineError(f"pipeline: base_dir must be a folder path (str or os.PathLike), "  # a raw TypeError
                                f"not {type(base_dir).__name__}")
        self.base_dir = Path(base_dir) if base_dir else Path.cwd()

    # -- builder
    def input(self, path: str | os.PathLike | list[str | os.PathLike], format: str = "jsonl",
              schema: str = "editor_event.v1") -> "Pipeline":
        """Read `path` (a file, folder or glob, or a list of them; any fsspec URL): `format` "jsonl"
        (.gz/.zst/.bz2/.xz too) or "parquet"; `schema` "editor_event.v1" (raw events, for ingest) or
        "training_record.v1" (records). A relative path is relative to the pipeline's folder."""
        self.config.input = _built(InputConfig, "input", path=_path_text(path), format=format, schema=schema)
        return self

    def add(self, stage: dict[str, Any] | StageConfig) -> "Pipeline":
        """Append a stage: a dict as in a pipeline file (`{"kind": "dedup", "exact": True}`), or a stage
        config object (a custom `StageConfig`). Checked now: an unknown kind or option is a PipelineError."""
        self.config.stages.append(parse_stage(stage, f"stage {len(self.config.stages) + 1}"))
        return self

    def output(self, path: str | os.PathLike, format: str = "parquet", shards: int | str = 1, **kw: Any) -> "Pipeline":
        """Write to the folder `path`: `format` parquet, packed, megatron or mds; `shards` a number or
        "auto"; other keywords as `output:` in a pipeline file (`key`, `rows_per_shard`, `index`,
        `quality`, `mode`, `allow_unmasked`...; schemas/pipeline.v1.json)."""
        self.config.output = _built(OutputConfig, "output", path=_path_text(path), format=format, shards=shards, **kw)
        return self

    # -- YAML
    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "pipeline", base_dir: str | Path | None = None) -> "Pipeline":
        """A pipeline from its mapping (a parsed pipeline file); relative paths are read from `base_dir`
        (default: the current folder); `where` names the source in error messages."""
        if not isinstance(data, dict):
            raise PipelineError(f"{where}: expected a mapping at the top level")
        data = copy.deepcopy(data)
        stages = data.pop("stages", []) or []
        if not isinstance(stages, list):
            raise PipelineError(f"{where}: 'stages' must be a list")
        parsed = [parse_stage(s, f"{where}: stage {i + 1}") for i, s in enumerate(stages)]
        try:
            config = PipelineConfig.model_validate({**data, "stages": []})
        except ValidationError as e:
            raise PipelineError(_format_errors(e, where, PipelineConfig)) from None
        config.stages = parsed
        p = cls(config.name, config.seed, base_dir=base_dir)
        p.config = config
        return p

    @classmethod
    def from_yaml(cls, path: str | Path) -> "Pipeline":
        """The pipeline file at `path`; its relative paths are relative to the file's folder."""
        path = Path(path)
        try:
            data = load_yaml(path.read_text(encoding="utf-8-sig"))
        except FileNotFoundError:
            raise PipelineError(f"pipeline file not found: {path}") from None
        except IsADirectoryError:  # found in a hostile-input review: "failed unexpectedly ... a bug", exit 3
            raise PipelineError(f"{path} is a folder; give the pipeline's YAML file") from None
        except UnicodeDecodeError:  # a binary or UTF-16 file: likewise
            raise PipelineError(f"{path}: not a UTF-8 text file (a pipeline file is YAML text)") from None
        except OSError as e:  # unreadable (permissions, an I/O error): the file's problem, not ours
            raise PipelineError(f"cannot read the pipeline file {path}: {e.strerror or type(e).__name__}") from None
        except DuplicateKeyError as e:
            raise PipelineError(f"{path}: {e}") from None
        except yaml.YAMLError as e:
            raise PipelineError(f"{path}: not valid YAML: {e}") from None
        return cls.from_dict(data, str(path), base_dir=path.parent)

    @classmethod
    def from_yaml_string(cls, text: str, base_dir: str | Path | None = None) -> "Pipeline":
        """A pipeline from YAML text; relative paths are read from `base_dir` (default: the current folder)."""
        if not isinstance(text, (str, bytes)):  # found in a Python API review: None was a raw AttributeError
            raise PipelineError(f"pipeline: from_yaml_string takes the YAML text (a str), not {type(text).__name__}"
                                + ("; for a file use Pipeline.from_yaml(path)" if isinstance(text, os.PathLike) else ""))
        try:
            data = load_yaml(text)
        except DuplicateKeyError as e:
            raise PipelineError(f"pipeline: {e}") from None
        except yaml.YAMLError as e:  # as from_yaml says it (found in review: a raw ParserError)
            raise PipelineError(f"pipeline: not valid YAML: {e}") from None
        return cls.from_dict(data, "pipeline", base_dir=base_dir)

    def to_dict(self) -> dict[str, Any]:
        """The pipeline as the mapping a pipeline file holds (paths as given, relative to its folder)."""
        d = self.config.model_dump(mode="json", by_alias=True, exclude_defaults=False)
        d["stages"] = [s.model_dump(mode="json", by_alias=True) for s in self.config.stages]
        for st in d["stages"]:
            st["kind"] = spelled_kind(st["kind"])  # a stage loaded by module path is saved as that path
            if not st.get("expect"):
                st.pop("expect", None)  # absent when unused: a pipeline's hash does not change with this field
            if st.get("kind") == "dedup" and st.get("history") is None:
                st.pop("history", None)  # likewise: unset = the mode's default; existing pipelines keep their hash
        if not d.get("spark"):
            d.pop("spark", None)
        if d.get("output") and d["output"].get("mds_size_limit") is None:
            d["output"].pop("mds_size_limit", None)  # unset: absent, so existing pipelines keep their hash
        if d.get("output") and d["output"].get("mode") == "overwrite":
            d["output"].pop("mode")  # the default is absent, so pipelines written before append mode keep their hash
        return d

    def to_yaml(self, path: str | Path | None = None) -> str:
        """The pipeline as YAML; with `path`, also written to that file.

        Relative paths in a pipeline file are relative to the file's folder, and a built pipeline's to
        the folder it was built in (its `base_dir`). So when the file goes to another folder its
        relative paths (input, output, each stage's `path_fields`) are rebased there, and
        `Pipeline.from_yaml(path)` is the same pipeline: found in review, a pipeline built in `s/` and
        written to `s/sub/p.yaml` wrote its output to `s/sub/out` once loaded again, without a word."""
        d = self.to_dict()
        for cfg in self.config.stages:
            if type(cfg).__module__ == "__main__":  # found in review: saved as a kind nothing else can load
                log.warning("stage %r is defined in the script itself (__main__): a pipeline file names it %r, which "
                            "`datakit run` and other processes cannot load; define it in a module and name it as "
                            "module:Class", cfg.kind, cfg.kind)
        if path is not None:
            dest = Path(path).absolute().parent
            d = _rebased(d, self.base_dir.absolute(), dest, self.config.stages)
        text = yaml.safe_dump(d, sort_keys=False)
        if path is not None:
            from datakit.io.atomic import write_bytes_atomic

            write_bytes_atomic(str(Path(path).absolute()), text.encode())
        return text

    def __eq__(self, other: object) -> bool:
        """The same pipeline: equal configs with every relative local path read from its own pipeline's
        folder (found in review: a pipeline saved with `to_yaml` into another folder and loaded back was
        not equal to itself, its relative paths spelled from the new folder)."""
        if not isinstance(other, Pipeline):
            return False
        mine, theirs = self.config, other.config
        return (_rebased(self.to_dict(), Path(self.base_dir).absolute(), None, mine.stages)
                == _rebased(other.to_dict(), Path(other.base_dir).absolute(), None, theirs.stages))

    __hash__ = None  # type: ignore[assignment]  # mutable builder

    # -- compile and run
    def compile(self, input_override: str | list[str] | None = None, output_override: str | None = None,
                history: list[dict[str, Any]] | None = None) -> Plan:
        """Turn the config into a logical plan (resolving globs now, so errors come early).

        `input_override`/`output_override` replace the file's paths; relative ones are relative to the
        current folder, as any path a program passes (the file's own paths: to the file's folder).
        `history`: in append mode, the committed snapshots (top-manifest entries) this run's dedup
        stage deduplicates against (see `datakit.io.snapshots.history`)."""
        from datakit.io.identity import base_environment, code_digests

        cfg = self.config
        if cfg.input is None:
            raise PipelineError(f"{cfg.name}: no input (set `input:` or call .input())")
        input_override = _from_caller(input_override, "input_override")
        output_override = _from_caller(output_override, "output_override", many=False)
        ctx = CompileContext(seed=cfg.seed, base_dir=self.base_dir, environment=base_environment())
        ctx.history = history
        if cfg.output is not None and isinstance(cfg.output.quality, str):
            from datakit.quality.gx import load_suite

            try:  # an unknown suite is one line before any work, not a traceback from inside the compile
                load_suite(cfg.output.quality)
            except (FileNotFoundError, ValueError) as e:
                raise PipelineError(f"{cfg.name}: output: quality: {e.args[0] if e.args else e}") from None
        paths = input_override if input_override is not None else cfg.input.path
        paths = [paths] if isinstance(paths, str) else list(paths)
        resolved = expand([ctx.resolve(p) for p in paths],
                          suffixes=(".parquet",) if cfg.input.format == "parquet" else ())
        out_path = output_override or (cfg.output.path if cfg.output else None)
        if out_path:
            out_path = ctx.resolve(out_path)
            if cfg.output is not None and cfg.output.index and cfg.output.format == "packed" \
                    and "://" in out_path and not out_path.startswith("file://"):
                # found in review: the index is built after the commit, and a packed dataset is read from a local
                # folder; such a run did all its work, published the dataset, then exited 2 (and a retry again)
                raise PipelineError(f"{cfg.name}: output.index: true on a packed dataset needs a local output folder "
                                    f"(the index reads packed sequences memory-mapped), not {out_path}; write the "
                                    "records as format parquet with index: true, or index a local copy "
                                    "(`datakit build-index`)")
            inside = _input_inside(resolved, out_path)
            if inside is not None:
                raise PipelineError(f"{cfg.name}: input {inside} is inside the output folder {out_path}: a run "
                                    "withdraws and replaces what that folder holds, so read from elsewhere or "
                                    "write to another folder")
        if cfg.input.format == "jsonl":
            # found in review: Parquet files were read as JSON Lines, every row quarantined (bad_utf8), exit 0
            parquet = [f for f in resolved if f.endswith(".parquet")]
            more = f" (and {len(parquet) - 1} more)" if len(parquet) > 1 else ""
            if parquet and len(parquet) == len(resolved):
                raise PipelineError(f"{cfg.name}: input: {parquet[0]}{more} is Parquet, but input.format is jsonl "
                                    "(the default): set `format: parquet` on the input")
            if parquet:  # beside JSON Lines logs (an opt-out list in the logs folder): not this input's data
                log.warning("%s: input: %s%s is Parquet among JSON Lines files and is not read (input.format is "
                            "jsonl); name the JSON Lines files to silence this", cfg.name, parquet[0], more)
                resolved = [f for f in resolved if not f.endswith(".parquet")]
        schema_name = cfg.input.schema_name
        try:
            contract = contracts.schema_by_name(schema_name)
        except KeyError as e:
            raise PipelineError(f"{cfg.name}: input: {e.args[0]}") from None
        if cfg.input.format == "jsonl":
            if schema_name != "editor_event.v1":  # found in a Python API review: the schema was ignored, so
                # records read as JSON Lines were ingested as editor events (every one quarantined)
                raise PipelineError(f"{cfg.name}: input: JSON Lines input is read as editor events "
                                    f"(editor_event.v1, through ingest); {schema_name} is read from Parquet: set "
                                    "`format: parquet` on the input (and write the records as Parquet)")
            rel = source(resolved, "jsonl", contracts.RAW_LINES, schema_name)
            current = "raw"
        elif schema_name == "editor_event.v1":
            # raw events for ingest: each row reaches the validator as JSON (readers.iter_parquet_rows),
            # so Parquet and JSON Lines follow one rule set and a bad row costs one quarantine row
            rel = source(resolved, "parquet", contracts.RAW_LINES, schema_name)
            current = "raw"
        else:
            rel = source(resolved, "parquet", contract, schema_name)
            current = schema_name
        ctx.output_path = out_path
        spans: list[StageSpan] = []
        checks: list[dict[str, Any]] = []
        names: dict[str, int] = {}
        for i, stage in enumerate(cfg.stages):
            where = f"{cfg.name}: stage {i + 1} ({stage.kind})"
            passes = current in getattr(stage, "passes_through", ())  # a filter that also reads this contract
            if stage.consumes != current and not passes and not (stage.consumes == "raw" and current == "editor_event.v1"):
                hint = (" (add {kind: ingest} first)" if current == "raw" else
                        " (add {kind: extract} first)" if current == "editor_event.v1" and stage.consumes == "training_record.v1"
                        else "")
                raise PipelineError(f"{where}: needs {stage.consumes} input but gets {current}{hint}")
            names[stage.kind] = names.get(stage.kind, 0) + 1
            name = stage.kind if names[stage.kind] == 1 else f"{stage.kind}_{names[stage.kind]}"
            stage_rel = Rel(rel.node, name)
            ctx.stage = name
            _check_columns(where, "reads", stage.columns_read(), rel.schema, "nothing before it writes")
            if stage.kind == "kto" and (kinds := _extract_kinds(cfg)) is not None and "feedback" not in kinds:
                # found in review: kto after an extract of the default kinds kept no record, exit 0, an empty dataset
                raise PipelineError(f"{where}: reads feedback records, but the extract stage makes only "
                                    f"{', '.join(sorted(kinds))}; add feedback to extract's kinds")
            try:
                out = stage.compile(stage_rel, ctx)
            except (ValueError, KeyError, FileNotFoundError) as e:  # a config that only fails when resolved
                msg = e.args[0] if e.args else str(e)
                raise PipelineError(f"{where}: {msg}") from None
            except (PipelineError, InputError):
                raise
            except Exception as e:  # a bug in a stage's compile (a custom one): one line naming it and where
                raise PipelineError(f"{where}: its compile() failed: {type(e).__name__}: {e}{_where_raised(e)}") from None
            if not isinstance(out, Rel):
                raise PipelineError(f"{where}: its compile() returned {type(out).__name__}, not the Rel it built "
                                    "(a missing `return`?)")
            _check_columns(where, "declares it writes", stage.writes, out.schema, "its output has no such column")
            try:
                last = i == len(cfg.stages) - 1
                lengths = last or cfg.stages[i + 1].kind == "tokenize"  # the report's length histograms
                out = self._quality_nodes(out, stage, last, lengths, checks, [s.kind for s in cfg.stages[:i + 1]])
            except ValueError as e:
                raise PipelineError(f"{where}: expect: {e.args[0] if e.args else e}") from None
            if stage.drops_by_content() and (dedup := _dedup_before(cfg.stages[:i])) is not None:
                log.warning("%s: drops records after stage %d (dedup) chose which copy of each duplicate to keep: "
                            "a kept record dropped here takes the copies dropped in its favour with it (the "
                            "clean ones too); put %s before dedup", where, dedup + 1, stage.kind)
            spans.append(StageSpan(name=name, kind=stage.kind, input=rel.node, output=out.node, emits=stage.emits))
            rel = out
            current = current if passes else stage.produces
        if current == "raw":
            raise PipelineError(f"{cfg.name}: event input needs an ingest stage ({{kind: ingest}}) first")
        if current == "tokenized_record.v1" and (cfg.output is None or cfg.output.format == "parquet") \
                and _extract_kinds(cfg) == {"preference"}:
            from datakit.stages.tokenize.stage import preference_only

            rel = preference_only(rel)  # no always-null packing columns in a preference-only Parquet output
        sink = None
        if out_path:
            o = cfg.output or OutputConfig(path=out_path)
            key = o.key or ctx.sink_key or ("event_id" if current == "editor_event.v1" else "doc_id")
            options = dict(ctx.sink_options)
            options["rows_per_shard"] = o.rows_per_shard
            if o.mds_size_limit is not None:
                if o.format != "mds":
                    raise PipelineError(f"{cfg.name}: output: mds_size_limit is for format mds (got {o.format!r})")
                options["mds_size_limit"] = o.mds_size_limit
            shards = 0 if o.shards == "auto" else o.shards
            sort_key = ctx.sink_sort_key
            if o.format in ("packed", "megatron", "mds") and "seq_len" not in options:
                # found out at compile, not after every stage has run and the sink tries to write
                raise PipelineError(f"{cfg.name}: output format {o.format!r} needs a tokenize stage "
                                    f"({{kind: tokenize, ...}}) before it; use format: parquet for records")
            if options.get("packing") == "repository" and o.format != "packed":
                raise PipelineError(f"{cfg.name}: packing: repository needs output format 'packed' (got {o.format!r})")
            if not o.allow_unmasked:
                _check_loss_masks(cfg, o.format)
            if key not in rel.schema.names:
                raise PipelineError(f"{cfg.name}: output: key {key!r} is not a column of the output "
                                    f"({', '.join(rel.schema.names)})")
            sink = SinkSpec(path=out_path, format=o.format, shards=shards, key=key, sort_key=sort_key, options=options)
        # every local path as the run resolved it (the stages' path fields too: found in review, a pipeline
        # saved with `to_yaml` into another folder hashed differently by its forget list's spelling)
        config = _rebased(self.to_dict(), Path(self.base_dir).absolute(), None, cfg.stages)
        # the run's real input and output, resolved (a `--input`/`--output` override replaces the file's
        # paths): the config hash and the manifest describe what was run, not how a path was spelled
        # (found in review: `run()` and `run(output="o")` into the same folder hashed differently, so the
        # second reused none of the first's shards; so did the same pipeline saved with `to_yaml`)
        # (a presigned URL's signature hidden: a credential, and not what the run read; io/url_secrets.py)
        used = [hide_url_secrets(ctx.resolve(p)) for p in paths]
        config["input"]["path"] = used[0] if len(used) == 1 else used
        if out_path and config.get("output") is not None:
            config["output"]["path"] = out_path
        elif out_path:
            config["output"] = {"path": out_path}
        plan = Plan(root=rel.node, sink=sink, spans=spans, config=config, seed=cfg.seed,
                    environment=ctx.environment, checks=checks)
        custom = code_digests([*cfg.stages, *(_unwrapped(n.fn) for n in plan.nodes() if isinstance(n, MapBatches))])
        if custom:  # custom stages' code: an edit of it is another run (io/identity.py)
            plan.environment.setdefault("code", {})["modules"] = custom
            _check_picklable(cfg.name, plan)
        return plan

    def _quality_nodes(self, rel: Rel, stage: StageConfig, last: bool, lengths: bool,
                       checks: list[dict[str, Any]], ran: list[str] | None = None) -> Rel:
        """After a stage: its `expect:` checks, the boundary suite (with `output.quality`), the report's profile."""
        from datakit.quality import expect, profile, suites

        if stage.expect:
            rel = expect.attach(rel, list(stage.expect), checks)
        o = self.config.output
        if o is not None and o.quality:
            for suite in suites.boundary_suites(stage.kind, o.quality, last, ran or [stage.kind]):
                n = len(checks)
                applies = suites.expectations(suite, rel.schema)
                if isinstance(o.quality, str) and suite.get("expectations") and not applies:
                    # found in review: a named suite none of whose checks fits the output's rows passed
                    # silently; `datakit validate` says "no suite applies" (exit 2) for the same case
                    raise PipelineError(f"{self.config.name}: output: quality: suite {o.quality!r} has no check "
                                        f"for these rows (columns: {', '.join(rel.schema.names)})")
                rel = expect.attach(rel, applies, checks)
                for c in checks[n:]:
                    c["suite"] = suite["name"]
        return profile.attach(rel, lengths=lengths)

    def explain(self, format: str = "text", **kw: Any) -> str:
        """The compiled plan as text (each node once, inputs by id) or Graphviz `dot`."""
        return self.compile(**kw).explain(format)

    def run(self, engine: str = "local", *, input: str | list[str] | None = None, output: str | None = None,
            report: bool = False, snapshot: str | None = None, **engine_options: Any):
        """Compile and execute; returns the engine's `RunResult` (per-stage counts, manifest, output path).

        `report=True` also writes OUTPUT/_report.html (plots of counts, lengths, findings; `datakit run`
        does by default). It is a view of `_run.json`, not data, so it is not part of the config.
        A relative `input`/`output` is relative to the current folder (found in review: the
        spark-submit example driver's `--output out` was written beside the pipeline file).

        `engine_options`: for `engine="local"`, `workers` (default: all usable cores; a small input runs
        in this process), `work_dir`, `progress`, `keep_work`; for `engine="spark"`, `master` (e.g.
        "local[4]", "spark://host:7077"), `conf` (a dict of Spark settings), `partitions`, `workers`,
        `checkpoint_dir` (docs/spark.md). `snapshot`: append mode's snapshot id (docs/scheduling.md)."""
        if engine == "local":
            from datakit.engines.local.engine import refuse_run_at_worker_import

            refuse_run_at_worker_import()
        from datakit.run_timing import RunTimer

        input, output = _from_caller(input, "input"), _from_caller(output, "output", many=False)

        timer = RunTimer()  # every second of the run, by phase: `timing` in _run.json
        t = time.perf_counter()
        from datakit.engines import get_engine

        if engine == "spark" and self.config.spark:
            from datakit.engines.spark_session import merged_conf

            engine_options["conf"] = merged_conf(self.config.spark, engine_options.get("conf"))
        try:  # engine options are checked before any work (and before the output folder is touched)
            runner = get_engine(engine, **engine_options)
        except (ValueError, TypeError) as e:
            raise PipelineError(f"{self.config.name}: {e.args[0] if e.args else e}") from None
        runner.prestart()  # Spark: the session starts while the pipeline compiles (~0.4 s of its ~3.5 s)
        timer.add("engine_start", time.perf_counter() - t)
        o = self.config.output
        try:
            if o is not None and o.mode == "append":
                return self._run_snapshot(runner, engine, engine_options, report, input, output, snapshot, timer)
            if snapshot is not None:
                raise PipelineError(f"{self.config.name}: --snapshot needs output mode: append")
            t = time.perf_counter()
            plan = self.compile(input_override=input, output_override=output)
        except BaseException:
            runner.settle()  # no session left half-started behind the error
            raise
        timer.add("compile", time.perf_counter() - t)
        if plan.sink is None:
            return runner.execute(plan)
        from datakit.io.publish import output_lock

        with output_lock(plan.sink.path):  # the run and what it writes after the commit: one writer
            return self._run_and_finish(plan, runner, engine, engine_options, report, timer)

    def _run_snapshot(self, runner: Any, engine: str, engine_options: dict[str, Any], report: bool,
                      input: str | list[str] | None, output: str | None, snapshot: str | None, timer: Any = None):
        """Append mode: run into OUT/_snapshots/<ID> (an ordinary output folder), write the snapshot's
        dedup state, then commit the union (datakit.io.snapshots). One writer holds OUT's lock throughout."""
        from datakit.io import snapshots
        from datakit.io.publish import output_lock
        from datakit.stages.dedup.history import history_config, write_state

        cfg = self.config
        top_path = CompileContext(base_dir=self.base_dir).resolve(output or cfg.output.path).rstrip("/")
        derived_from: list[str] | None = None
        if snapshot is None:
            paths = input if input is not None else cfg.input.path if cfg.input else []
            derived_from = [paths] if isinstance(paths, str) else list(paths)
            snapshot = snapshots.derive_id(derived_from)
            base = CompileContext(base_dir=self.base_dir)
            derived_from = [base.resolve(p) for p in derived_from]
        snapshot = snapshots.check_id(snapshot)
        snap_path = snapshots.snapshot_path(top_path, snapshot)
        with output_lock(top_path):
            top = snapshots.read_top(top_path)
            snapshots.check_order(top, snapshot)
            previous = snapshots.previous_entry(top, snapshot)
            if previous is not None and derived_from is not None:
                snapshots.check_same_partition(top_path, snapshot, derived_from)
            hist = [{**s, "root": top_path} for s in snapshots.history(top, snapshot)]
            lists = snapshots.forget_lists(top_path, top)
            t = time.perf_counter()
            plan = self._with_forget(lists).compile(input_override=input, output_override=snap_path, history=hist)
            if timer is not None:
                timer.add("compile", time.perf_counter() - t)
            snapshots.check_same_tokens(top_path, top, snapshot, _token_layout(plan))
            dedup = history_config(cfg.stages)
            if dedup is not None and cfg.output.format != "parquet":
                # the state is computed from the snapshot's committed records; token arrays hold no text
                raise PipelineError(f"{cfg.name}: dedup against history needs output format parquet (records); "
                                    f"append the record-level dataset and tokenize from it, or set history: false")
            top = snapshots.withdraw(top_path, top, snapshot)  # a rerun: the others stay readable meanwhile
            with output_lock(snap_path):
                result = self._run_and_finish(plan, runner, engine, engine_options, report, timer)
                if lists:
                    # the dataset's deletion lists reach the raw lines ingest could not read too, as `forget`
                    # filters them (found in an operations review: a retried night wrote a forgotten user's
                    # quarantined event back into `_quarantine/`, and a new night kept theirs)
                    from datakit.forget_snapshots import _filter_quarantine, _listed_ids, _read_lists

                    _filter_quarantine(snap_path, snap_path, _listed_ids(_read_lists(lists)))
                state = write_state(snap_path, snapshot, dedup) if dedup is not None else None
            result.extra["snapshot"] = snapshot
            result.extra["dataset"] = top_path
            if previous is not None and state is not None \
                    and (previous.get("dedup_state") or {}).get("sha256") != state.get("sha256"):
                # a redo that changed what later snapshots deduplicated against: they are stale
                top, stale = snapshots.withdraw_later(top_path, top, int(previous["seq"]))
                if stale:
                    result.extra["withdrawn"] = stale
                    _note_in_run_report(snap_path, "withdrew", stale)
                    log.warning(
                        "snapshot %s changed, and %s were deduplicated against its earlier version: they are "
                        "withdrawn from the dataset until rerun (rerun them, in this order, with the same "
                        "--snapshot ids)", snapshot, ", ".join(stale))
            snapshots.commit(top_path, top, snapshot, result.manifest, state)
        return result

    def _with_forget(self, lists: list[str]) -> "Pipeline":
        """This pipeline with the dataset's deletion lists applied (a `forget` stage right before dedup,
        or at the end of a record pipeline), so a forgotten document is never written again nor kept
        as a duplicate's reason. Unchanged when the dataset has no deletion lists."""
        if not lists:
            return self
        p = Pipeline.from_dict(self.to_dict(), self.config.name, base_dir=self.base_dir)
        stage = parse_stage({"kind": "forget", "optouts": lists}, "dataset deletion lists")
        at = next((i for i, s in enumerate(p.config.stages) if s.kind == "dedup"), None)
        if at is None:
            if p.config.stages and p.config.stages[-1].produces != "training_record.v1":
                raise PipelineError(f"{self.config.name}: the dataset has deletion lists (_forget/) but this pipeline "
                                    "writes no records to apply them to")
            at = len(p.config.stages)
        p.config.stages.insert(at, stage)
        return p

    def _run_and_finish(self, plan: Plan, runner: Any, engine: str, engine_options: dict[str, Any],
                        report: bool = False, timer: Any = None):
        """Execute, then the steps that read the committed output (quality, index, reports)."""
        t = time.perf_counter()
        if engine == "spark" and timer is not None:
            from datakit.engines.spark_session import get_session

            get_session(runner.master, runner.conf)  # started (or reused) here, so its seconds are engine start-up
            timer.add("engine_start", time.perf_counter() - t)
            t = time.perf_counter()
        result = runner.execute(plan)
        for st in result.stages or []:
            shared = (st.get("metrics") or {}).get("records_sharing_a_doc_id")
            if shared:  # the contracts say one record per doc_id; dedup cannot tell such records apart
                log.warning("stage %r: %d records share a doc_id with another record (a file read twice?); "
                            "dedup judges them together, so identical copies all stay", st["name"], shared)
            damaged = {}
            if st.get("kind") == "ingest" and st.get("dropped"):
                from datakit.stages.ingest import DAMAGED_INPUT_REASONS

                damaged = {r: n for r, n in sorted(st["dropped"].items()) if r in DAMAGED_INPUT_REASONS}
            if damaged:  # data lost before any stage could read it: said even under --quiet (found in review)
                log.warning("stage %r: damaged input files: %s; what lay after the damage was not read (each file "
                            "and line: the output's _quarantine/)", st["name"],
                            ", ".join(f"{r} {n}" for r, n in damaged.items()))
            if st.get("kind") == "ingest" and st.get("rows_in") and not st.get("rows_out"):
                # found in review: input the reader could not read as events (a compressed file under another
                # name, a CR-only file, Parquet of another schema) was quarantined line by line, exit 0, silent
                top = sorted((st.get("dropped") or {}).items(), key=lambda kv: (-kv[1], kv[0]))[:3]
                log.warning("stage %r: no input line was a valid event: all %d were quarantined (%s); see the "
                            "output's _quarantine/ for each file and line", st["name"], st["rows_in"],
                            ", ".join(f"{r} {n}" for r, n in top))
        worker_tasks = result.extra.pop("worker_tasks", None) or []  # the local pool's costs (run_timing)
        if timer is not None:
            timer.worker_tasks = worker_tasks
            executed = time.perf_counter() - t
            timer.add("stages", min(result.seconds, executed))  # the engine's own clock, up to the commit
            timer.add("commit", executed - min(result.seconds, executed))  # side outputs, manifest, clean-up
            t = time.perf_counter()
        result = self._finish(plan, result, engine, engine_options, report)
        if timer is not None and plan.sink is not None:
            from datakit.run_timing import record

            timer.add("after_commit", time.perf_counter() - t)
            if timer.one_run_process:  # (run_timing.one_run_process): its workers stop inside the run
                from datakit.workers import drop_all_pools

                t = time.perf_counter()
                drop_all_pools(wait=True)
                timer.add("release", time.perf_counter() - t)
            result.extra["timing"] = _after_commit(plan.sink.path, "run timing (_run.json)",
                                                   lambda: record(f"{plan.sink.path.rstrip('/')}/_run.json", timer))
        return result

    def _finish(self, plan: Plan, result: Any, engine: str, engine_options: dict[str, Any], report: bool):
        """The steps after the commit that read the committed output: quality, index, report, feedback."""
        o = self.config.output
        if o is not None and o.quality and plan.sink is not None:
            self._validate(plan, result, engine, engine_options)
        if o is not None and o.index and plan.sink is not None:
            # the index is a plan too: on the engine that ran the pipeline (a local run's worker count)
            from datakit.indexing import build_index
            from datakit.stages.decontaminate.index import INDEX_DIRNAME

            stage = next((s for s in self.config.stages if s.kind == "decontaminate"), None)
            kw: dict[str, Any] = {"ngram": stage.ngram, "normalization": list(stage.normalizations)} if stage else {}
            opts = {k: v for k, v in engine_options.items() if k in ("master", "conf", "workers")}
            if engine == "local":
                opts = {"workers": engine_options.get("workers") or (result.extra or {}).get("workers")}
            out = f"{plan.sink.path.rstrip('/')}/{INDEX_DIRNAME}"
            info = build_index(plan.sink.path, out, engine=engine, allow_empty=True, **kw, **opts)
            result.extra["index"] = {"path": out, "engine": engine, "ngrams": info.ngrams}
        if report and plan.sink is not None:
            from datakit.quality.report import write_report

            result.extra["report"] = _after_commit(plan.sink.path, "report page (_report.html)",
                                                   lambda: write_report(plan.sink.path))

        if plan.sink is not None and self.config.stages and self.config.stages[-1].kind == "kto" \
                and plan.sink.format == "parquet":
            from datakit.stages.kto.report import REPORT_FILE, write_report

            # reward summaries from the committed rows (identical on both engines): _reports/feedback.json
            feedback = _after_commit(plan.sink.path, f"reward summary ({REPORT_FILE})", lambda: write_report(plan.sink.path))
            if feedback is not None:
                result.extra["feedback"] = {**feedback, "file": REPORT_FILE}
        return result

    def _validate(self, plan: Plan, result: Any, engine: str, engine_options: dict[str, Any]) -> None:
        """Record the output's quality in `_run.json`: the last stage's suite results (checked inside the
        run, before commit, on exactly the rows written) and, for packed outputs, the per-shard array
        checks, which need the written files and manifest. A failed array check fails the run (exit 1)."""
        from datakit.io.atomic import write_json_atomic
        from datakit.io.fs import filesystem
        from datakit.quality.expect import QualityGateError, failure_line
        from datakit.quality.packed import check_packed

        last = result.stages[-1] if result.stages else {}
        checks = [r for r in last.get("expectations", []) if r.get("suite")]
        if plan.sink.format == "packed":
            opts = {k: v for k, v in engine_options.items() if k in ("workers", "master", "conf")}
            checks += [{**r, "suite": "packed"} for r in check_packed(plan.sink.path, result.manifest, None, engine, **opts)]
        q = {"suite": ", ".join(sorted({r["suite"] for r in checks})), "success": all(r["success"] or r["severity"] != "error"
                                                                                  for r in checks),
             "rows": last.get("emitted", last.get("rows_out", 0)),
             "failed": [{"expectation": r["type"], "column": r.get("column"), "unexpected_count": r["unexpected"]}
                        for r in checks if not r["success"]]}
        result.extra["quality"] = q
        run_path = f"{plan.sink.path.rstrip('/')}/_run.json"
        fs, p = filesystem(run_path)
        run = json.loads(fs.cat_file(p))
        run["quality"] = q
        write_json_atomic(run_path, run)
        bad = next((r for r in checks if not r["success"] and r["severity"] == "error"), None)
        if bad is not None:
            raise QualityGateError(failure_line("output", bad) + " (the output was written; do not use it)")


def _rebased(d: dict[str, Any], base: Path, dest: Path | None, stages: list[StageConfig]) -> dict[str, Any]:
    """`d` (a `to_dict`) with its relative local paths made relative to `dest` instead of `base`
    (`dest` None: absolute, as the config hash records them)."""
    if dest is not None and base.resolve() == dest.resolve():
        return d

    def one(p: Any, must_exist: bool = False) -> Any:
        if isinstance(p, str) and p.startswith("~") and dest is None:
            return os.path.expanduser(p)  # the hash records the folder meant, as for any other path
        if not isinstance(p, str) or not p or "://" in p or os.path.isabs(p) or p.startswith("~"):
            return p
        full = os.path.join(base, p)
        if must_exist and not os.path.exists(full):
            return p  # a name, not a file (a registry eval, a Hub tokenizer id, `datakit:NAME`)
        return os.path.abspath(full) if dest is None else os.path.relpath(full, dest)

    def many(v: Any, must_exist: bool = False) -> Any:
        return [one(x, must_exist) for x in v] if isinstance(v, list) else one(v, must_exist)

    def eval_spec(e: Any) -> Any:
        """An eval: a registry name or file, `NAME=FILE`, or `{name, path, ...}`."""
        if isinstance(e, dict):
            return dict(e, path=one(e.get("path")))
        if isinstance(e, str) and "=" in e:
            name, file = e.split("=", 1)
            whole = one(e, True)
            if whole != e and one(file, True) == file:  # a path holding `=` (`version=2/mbpp.jsonl`), not NAME=FILE
                return whole
            return f"{name}={one(file, True)}"
        return one(e, True)

    d = copy.deepcopy(d)
    if d.get("input"):
        d["input"]["path"] = many(d["input"]["path"])
    if d.get("output"):
        d["output"]["path"] = one(d["output"]["path"])
    for st, cfg in zip(d.get("stages", []), stages):
        for name in type(cfg).path_fields:
            v = st.get(name)
            if name == "evals" and isinstance(v, list):
                st[name] = [eval_spec(e) for e in v]
            elif v is not None:
                st[name] = many(v, must_exist=name == "tokenizer")
    return d


def _check_picklable(name: str, plan: Plan) -> None:
    """Every custom batch function can be sent to a worker process or a Spark executor (pickled).

    Why at compile: found in review, a function holding a `threading.Lock` ran on a sample (a small
    input runs in this process) and failed on the full input (pool workers, Spark) with a bare
    `TypeError: cannot pickle '_thread.lock' object`, naming no stage. datakit's own functions are
    tested to pickle; only the user's are tried here."""
    import cloudpickle

    for node in plan.nodes():
        if not isinstance(node, MapBatches):
            continue
        fn = _unwrapped(node.fn)
        module = getattr(fn if inspect.isroutine(fn) else type(fn), "__module__", "") or ""
        if module == "datakit" or module.startswith("datakit."):
            continue
        try:
            cloudpickle.dumps(node.fn)
        except Exception as e:  # noqa: BLE001 - whatever pickling raises, said with the stage's name
            first = str(e).splitlines()[0][:200] if str(e) else type(e).__name__
            raise PipelineError(f"{name}: stage {node.stage!r} ({node.name}): its batch function cannot be pickled "
                                f"({type(e).__name__}: {first}); worker processes and Spark executors receive it "
                                "pickled: create locks, open files, clients and models in its setup() "
                                "instead") from None


def _unwrapped(fn: object) -> object:
    """A batch function as its author wrote it (a `ByValue` wrapper's function)."""
    return fn.__dict__["fn"] if isinstance(fn, ByValue) else fn


def _token_layout(plan: Plan) -> dict[str, Any] | None:
    """What every snapshot of a token dataset must share (`snapshots.check_same_tokens`); None for records."""
    from datakit.io.snapshots import token_layout

    o = (plan.sink.options or {}) if plan.sink is not None else {}
    if "seq_len" not in o:
        return None
    return token_layout(plan.sink.format, o["seq_len"], o.get("tokenizer_sha256"))


def _note_in_run_report(out: str, key: str, value: Any) -> None:
    """Add `key` to OUT/_run.json (before the snapshot's commit: the report a scheduler archives says what
    this run did to the dataset; found in an operations review: a redo that withdrew later snapshots
    said so only in a warning line and in `run --json`)."""
    from datakit.io.atomic import read_json, write_json_atomic

    path = f"{out.rstrip('/')}/_run.json"
    run = read_json(path)
    if run is not None:
        run[key] = value
        write_json_atomic(path, run)


def _after_commit(out: str, what: str, write: Any) -> Any:
    """Write a view of a committed dataset (its report page, run timing, reward summary); when storage
    fails, warn and go on: the dataset stays committed and the command succeeds.

    Why: a disk that filled up after the commit made the command exit 3 with `_SUCCESS` and the
    manifest written (found in review); a scheduler that retries on 3 first retracted a good dataset.
    These views are rendered again from the data (`datakit report OUT`); an error that is not
    storage's still fails the run.
    """
    from datakit.io import storage

    try:
        return write()
    except Exception as e:  # noqa: BLE001 - sorted below
        if not (isinstance(e, (OSError, storage.StorageError)) or storage.is_storage_error(e)):
            raise
        log.warning(
            "the dataset at %s is committed, but its %s could not be written: %s", out, what, storage.short_reason(e))
        return None


def _path_text(paths: Any) -> Any:
    """A `pathlib.Path` (or a list holding some) as the text the config stores; anything else as given.

    Why: `Pipeline.run(output=Path("o"))` was a bare `TypeError: 'PosixPath' object is not iterable`,
    and `.input(Path(...))` a pydantic type error, while the loaders take a `Path` (found in review)."""
    if isinstance(paths, os.PathLike):
        return os.fspath(paths)
    if isinstance(paths, (list, tuple)):
        return [os.fspath(p) if isinstance(p, os.PathLike) else p for p in paths]
    return paths


def _from_caller(paths: str | os.PathLike | list[str | os.PathLike] | None, what: str = "path",
                 many: bool = True) -> Any:
    """Override paths a caller passed (`run`, `compile`), relative ones joined to the current folder.

    `what` names the argument, `many` whether it takes a list of paths: anything else is one PipelineError
    (found in a Python API review: `run(output=123)` was `TypeError: 'int' object is not iterable`)."""
    paths = _path_text(paths)
    if paths is None:
        return None
    if isinstance(paths, str):
        return from_cwd(paths)
    bad = [p for p in paths if not isinstance(p, str)] if isinstance(paths, list) else [paths]
    if many and isinstance(paths, list) and paths and not bad:
        return [from_cwd(p) for p in paths]
    raise PipelineError(f"{what} must be a path (str or os.PathLike){' or a non-empty list of them' if many else ''}, "
                        f"not {type(paths).__name__}"
                        + (f" holding {bad[0]!r} ({type(bad[0]).__name__})" if isinstance(paths, list) and bad else ""))
