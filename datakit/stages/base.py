"""What a stage is: a pydantic config with a `kind`, that compiles itself into plan nodes.

Why pydantic configs: a YAML pipeline file and a Python script must describe the
*same* object, validated the same way, with errors naming the field. A stage
never touches an engine; it only adds nodes through `Rel` (see `datakit.plan`).
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

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
    """What a stage may know while compiling: the seed, where relative paths resolve, the run folder.

    `artifacts` is a scratch dict stages can use to hand information to later
    stages or to the sink (e.g. the tokenizer's manifest fields).
    """

    seed: int = 0
    base_dir: Path = field(default_factory=Path.cwd)
    output_path: str | None = None
    artifacts: dict[str, Any] = field(default_factory=dict)
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
        """Resolve a pipeline-relative local path; URLs (s3://, memory://) pass through."""
        if "://" in path or Path(path).is_absolute():
            return path
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

    def compile(self, rel: Rel, ctx: CompileContext) -> Rel:  # pragma: no cover - abstract
        raise NotImplementedError(f"stage {self.kind!r} does not implement compile()")


def register_stage(cls: type[StageConfig]) -> type[StageConfig]:
    """Class decorator: make a stage config available under its `kind` (also for user stages)."""
    kind_field = cls.model_fields.get("kind")
    kind = getattr(kind_field, "default", None)
    if not isinstance(kind, str):
        raise TypeError(f"{cls.__name__} needs a default `kind` string, e.g. kind: Literal['mine'] = 'mine'")
    _REGISTRY[kind] = cls
    return cls


def stage_class(kind: str) -> type[StageConfig]:
    """The config class for `kind`, importing a built-in stage module on first use."""
    if kind not in _REGISTRY and kind in BUILTIN_STAGE_MODULES:
        importlib.import_module(BUILTIN_STAGE_MODULES[kind])
    try:
        return _REGISTRY[kind]
    except KeyError:
        known = sorted(set(_REGISTRY) | set(BUILTIN_STAGE_MODULES))
        raise KeyError(f"unknown stage kind {kind!r}; known kinds: {', '.join(known)}") from None


def known_kinds() -> list[str]:
    return sorted(set(_REGISTRY) | set(BUILTIN_STAGE_MODULES))
