"""What a stage is: a pydantic config with a `kind`, that compiles itself into plan nodes.

Why pydantic configs: a YAML pipeline file and a Python script must describe the
*same* object, validated the same way, with errors naming the field. A stage
never touches an engine; it only adds nodes through `Rel` (see `datakit.plan`).
"""
from __future__ import annotations

import importlib
import importlib.metadata
from dataclasses import dataclass, field
import os
from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from datakit.io.fs import refuse_empty_path
from datakit.plan import Rel
from datakit.quality.expect import Expectation

# Built-in stages are imported lazily (kind -> module), so `import datakit` stays
# fast and a stage's heavy dependencies (presidio, tokenizers) load only when used.
BUILTIN_STAGE_MODULES: dict[str, str] = {
    "ingest": "datakit.stages.ingest",
    "consent": "datakit.stages.consent",
    "forget": "datakit.stages.forget",
    "extract": "datakit.stages.extract.stage",
    "scrub_pii": "datakit.stages.scrub_pii.stage",
    "dedup": "datakit.stages.dedup.stage",
    "decontaminate": "datakit.stages.decontaminate.stage",
    "tokenize": "datakit.stages.tokenize.stage",
    "kto": "datakit.stages.kto.stage",
}

_REGISTRY: dict[str, type["StageConfig"]] = {}


@dataclass
class CompileContext:
    """What a stage may know while compiling: the seed, where relative paths resolve, the run folder;
    and what it may tell the output sink (typed fields, so a value nobody reads cannot be written).

    `sink_key`/`sink_sort_key`/`sink_options` are how a stage shapes the output (the tokenize stage:
    shard by repository group, sort by doc_id, the packed/megatron writer's options); an output's own
    `key:` wins over `sink_key`.
    """

    seed: int = 0
    base_dir: Path = field(default_factory=Path.cwd)
    output_path: str | None = None
    sink_key: str | None = None
    sink_sort_key: str | None = None
    sink_options: dict[str, Any] = field(default_factory=dict)
    # what the output depends on beyond the config (recorded in the manifest, folded into the
    # config hash): `record` files it under the stage being compiled (`stage`, set by the compiler)
    environment: dict[str, Any] = field(default_factory=dict)
    stage: str = ""
    # append mode: the committed snapshots a dedup stage deduplicates against (None: not append mode)
    history: list[dict[str, Any]] | None = None

    def record(self, key: str, value: Any) -> None:
        """Note something this stage's output depends on that the config alone does not pin:
        an artifact's digest, a library version, a choice made from what is installed.
        It lands in the manifest and in the config hash, so reuse of earlier work is refused
        when it differs (see docs/architecture.md, "The determinism contract")."""
        self.environment.setdefault("stages", {}).setdefault(self.stage or "?", {})[key] = value

    def resolve(self, path: str) -> str:
        """Resolve a pipeline-relative local path; URLs (s3://, memory://) pass through. `~/...` is the
        user's home, as in a shell (found in review: `output: {path: ~/data}` wrote into a folder named
        `~` beside the pipeline file)."""
        refuse_empty_path(path)  # (`path: ""` is the pipeline file's folder: every file below it)
        if "://" in path:
            return path
        path = os.path.expanduser(path)
        if Path(path).is_absolute():
            return os.path.normpath(path)  # spelled as a relative one resolves (`.`, `..`, trailing slash)
        return str((self.base_dir / path).resolve())


class StageConfig(BaseModel):
    """Base of every stage config. Subclasses set `kind` as a Literal and implement `compile`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: str
    # great-expectations checks of this stage's output rows, inside the run (datakit/quality/expect.py)
    expect: list[Expectation] = Field(default_factory=list)
    # the input contract the stage needs and the one it produces ("editor_event.v1" / "training_record.v1")
    consumes: ClassVar[str] = "training_record.v1"
    produces: ClassVar[str] = "training_record.v1"
    # what the stage's output rows are when they are not the same unit as its input
    emits: ClassVar[str] = "rows"
    # the top-level columns the stage reads and the ones it adds or rewrites: the compiler checks each
    # column read is in the stage's input (written by the source or a stage before it) and each
    # column written is in its output, so a pipeline that reads what nobody writes fails at compile
    reads: ClassVar[tuple[str, ...]] = ()
    writes: ClassVar[tuple[str, ...]] = ()
    # fields holding local paths, which a pipeline file resolves against its own folder: rebased when
    # the pipeline is saved into another folder (`Pipeline.to_yaml(path)`), so the file means the same
    path_fields: ClassVar[tuple[str, ...]] = ()

    def columns_read(self) -> tuple[str, ...]:
        """The columns this config reads: `reads`, plus any a field names (override then)."""
        return self.reads

    def drops_by_content(self) -> bool:
        """Whether this config may drop a training record for what its text holds (a secret, an eval
        problem). Why the compiler asks: after a `dedup` stage such a drop can remove the copy dedup
        kept, and the copies it dropped in its favour are gone with it (found in review: a clean file was
        lost because its near duplicate, the kept one, held a pasted HumanEval solution)."""
        return False

    def compile(self, rel: Rel, ctx: CompileContext) -> Rel:  # pragma: no cover - abstract
        raise NotImplementedError(f"stage {self.kind!r} does not implement compile()")


def register_stage(cls: type[StageConfig]) -> type[StageConfig]:
    """Class decorator: make a stage config available under its `kind` (also for user stages)."""
    kind_field = cls.model_fields.get("kind")
    kind = getattr(kind_field, "default", None)
    if not isinstance(kind, str):
        raise TypeError(f"{cls.__name__} needs a default `kind` string, e.g. kind: Literal['mine'] = 'mine'")
    # found in review: a user class of kind "dedup" silently replaced the built-in stage for the whole
    # process. The same class again (a module reloaded, a notebook cell run twice) replaces itself.
    builtin = BUILTIN_STAGE_MODULES.get(kind)
    if builtin is not None and cls.__module__ != builtin:
        raise TypeError(f"{cls.__module__}.{cls.__qualname__}: kind {kind!r} is a built-in stage; give the "
                        "custom stage its own kind")
    old = _REGISTRY.get(kind)
    if old is not None and old is not cls and _qualified(old) != _qualified(cls):
        raise TypeError(f"{_qualified(cls)}: kind {kind!r} is already the stage {_qualified(old)}; "
                        "give each stage its own kind")
    _REGISTRY[kind] = cls
    return cls


def _qualified(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


# entry-point group a package lists its stages under (pyproject: [project.entry-points."datakit.stages"],
# `upper_case = "mypkg.stages:UpperCase"`): `kind: upper_case` then works without any import
ENTRY_POINT_GROUP = "datakit.stages"


def stage_class(kind: str) -> type[StageConfig]:
    """The config class for `kind`: a registered or built-in kind, a module path `pkg.mod:Class`
    (imported here), or the name of an entry point in the `datakit.stages` group.

    Why by path or entry point: a YAML pipeline must be runnable by `datakit run` without a script
    that imports the user's stage first. Any failure is a `KeyError` with one line naming the kind."""
    if not isinstance(kind, str):
        raise KeyError(f"a stage kind is a string (got {type(kind).__name__})")
    if kind not in _REGISTRY and kind in BUILTIN_STAGE_MODULES:
        importlib.import_module(BUILTIN_STAGE_MODULES[kind])
    if kind in _REGISTRY:
        return _REGISTRY[kind]
    if ":" in kind:
        cls = _load_stage(kind, kind)
        _REGISTRY[kind] = cls
        return cls
    eps = [ep for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP) if ep.name == kind]
    if eps:
        cls = _load_stage(eps[0].value, kind)
        if _kind_of(cls) != kind:
            raise KeyError(f"stage kind {kind!r}: entry point {eps[0].value!r} is a stage of kind "
                           f"{_kind_of(cls)!r}; name the entry point after the stage's kind")
        return cls
    raise KeyError(f"unknown stage kind {kind!r}; known kinds: {', '.join(known_kinds())} "
                   f"(a custom stage: kind: package.module:ClassName)")


def _load_stage(path: str, kind: str) -> type[StageConfig]:
    """Import `module:Class` and check it is a stage config (registered here if it was not)."""
    module, _, name = path.partition(":")
    if not module or not name:
        raise KeyError(f"stage kind {kind!r}: expected package.module:ClassName")
    try:
        mod = importlib.import_module(module)
    except Exception as e:  # noqa: BLE001 - the user's module: any import failure is one line, not a traceback
        raise KeyError(f"stage kind {kind!r}: cannot import module {module!r} ({type(e).__name__}: {e})") from None
    cls = mod
    for part in name.split("."):
        cls = getattr(cls, part, None)
        if cls is None:
            raise KeyError(f"stage kind {kind!r}: module {module!r} has no {name!r}")
    if not (isinstance(cls, type) and issubclass(cls, StageConfig)):
        raise KeyError(f"stage kind {kind!r}: {name!r} is not a StageConfig subclass")
    _kind_of(cls)
    return register_stage(cls) if _kind_of(cls) not in _REGISTRY else cls


def _kind_of(cls: type[StageConfig]) -> str:
    kind = getattr(cls.model_fields.get("kind"), "default", None)
    if not isinstance(kind, str):
        raise KeyError(f"{cls.__name__} needs a default `kind` string, e.g. kind: Literal['mine'] = 'mine'")
    return kind


def spelled_kind(kind: str) -> str:
    """How a pipeline file names `kind`: a built-in or entry-point kind as itself, any other registered
    stage as `module:Class`, which a fresh process can import (`stage_class`).

    Why from the class and not from how this process loaded it: the spelling is part of the config,
    so of `pipeline_hash`; it changed when some other pipeline in the process had named the stage by
    path (and shard reuse was lost), and a stage added as a class was saved as a bare kind that a
    fresh process could not load (found in review). A class defined in `__main__` (a notebook) keeps
    its kind: no other process can import it by path."""
    if kind in BUILTIN_STAGE_MODULES or ":" in kind:
        return kind
    cls = _REGISTRY.get(kind)
    if cls is None or not _importable(cls) or kind in _entry_point_kinds():
        return kind
    return f"{cls.__module__}:{cls.__qualname__}"


def _importable(cls: type) -> bool:
    """Whether `module:qualname` of `cls` imports as `cls` itself (not a class made in a function or
    with `type()`, nor one of `__main__`)."""
    import sys

    if cls.__module__ in ("__main__", "__mp_main__"):
        return False
    obj: Any = sys.modules.get(cls.__module__)
    for part in cls.__qualname__.split("."):
        obj = getattr(obj, part, None)
    return obj is cls


def _entry_point_kinds() -> frozenset[str]:
    """Read each time (only a custom stage asks): a package installed into the running process counts."""
    return frozenset(ep.name for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP))


def known_kinds() -> list[str]:
    return sorted(k for k in set(_REGISTRY) | set(BUILTIN_STAGE_MODULES) if ":" not in k)
