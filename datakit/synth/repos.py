"""Multi-file repositories with a real import structure, for the synthetic logs (`repositories=N`).

Why: repository-level packing (long context) must order a repository's files
so that a file follows the files it imports, and feedback training needs
accept/reject/partial/ignored outcomes whose *retention* (is the accepted text
still there at the next event?) is known. Windows cut from unrelated stdlib
files have neither, so a project here is built on purpose:

- a dependency DAG over its files (Python, TypeScript, JavaScript, Go, Rust),
  written as the import syntax of the language (relative and absolute Python
  imports, ES `import`/`require`, Go package imports under the module path,
  Rust `mod`/`use crate::`); a few imports of the standard library / third
  parties that resolve to no file of the repository;
- bodies from the corpus (Python) or from templates (other languages), with
  every import-like line of the corpus text neutralised so the only imports
  between repository files are the planted ones (the ground truth edges).

`build_repository` is pure (a function of the rng and the corpus), so the
generator can derive both the events and the ground truth from one object.
"""
from __future__ import annotations

import random
import re
from dataclasses import dataclass, field

from datakit.synth.events import weighted

LANG_WEIGHTS = (("python", 0.55), ("typescript", 0.15), ("javascript", 0.1), ("go", 0.12), ("rust", 0.08))
_WORDS = ("util", "models", "client", "server", "config", "parser", "cache", "store", "auth", "api", "events",
          "handlers", "schema", "metrics", "queue", "worker", "render", "session", "tokens", "paths", "errors",
          "retry", "codec", "index", "search", "billing", "report", "export", "graph", "scheduler")
_DIRS = ("core", "io", "net", "app", "lib", "data", "web", "services")
_IMPORT_LINE = re.compile(r"^(\s*)(?:import|from)\s.*$")


@dataclass
class RepoFile:
    path: str
    text: str
    imports: list[str] = field(default_factory=list)  # repository paths this file depends on (ground truth)


@dataclass
class Repository:
    repo_id: str
    commit: str
    language: str
    files: list[RepoFile]


def _neutralise_imports(text: str) -> str:
    """Corpus text with import lines turned into `pass` (same indentation): no unplanned edges."""
    return "\n".join(_IMPORT_LINE.sub(lambda m: m.group(1) + "pass", ln) for ln in text.split("\n"))


def _python_body(rng: random.Random, corpus, chunks: int) -> str:
    pool = corpus.pools.get("python") or next(iter(corpus.pools.values()))
    parts = [_neutralise_imports(corpus.text(pool[rng.randrange(len(pool))])) for _ in range(chunks)]
    return "\n\n".join(p.rstrip("\n") for p in parts) + "\n"


def _ident(rng: random.Random) -> str:
    return rng.choice(_WORDS) + "_" + rng.choice(("value", "items", "load", "parse", "build", "check", "merge", "apply"))


def _template_body(rng: random.Random, lang: str, functions: int) -> str:
    out = []
    for i in range(functions):
        name = f"{_ident(rng)}{i}"
        n = rng.randint(2, 14)
        if lang in ("typescript", "javascript"):
            sig = f"export function {name}(items{': number[]' if lang == 'typescript' else ''}, limit{': number' if lang == 'typescript' else ''})"
            body = [f"  let total = {rng.randint(0, 9)};", "  for (const item of items) {"]
            body += [f"    if (item > limit - {k}) {{ total += item * {k + 1}; }}" for k in range(n)]
            body += ["  }", "  return total;"]
            out.append(sig + " {\n" + "\n".join(body) + "\n}\n")
        elif lang == "go":
            fname = name[0].upper() + name[1:].replace("_", "")
            body = ["\ttotal := 0", "\tfor _, item := range items {"]
            body += [f"\t\tif item > limit-{k} {{\n\t\t\ttotal += item * {k + 1}\n\t\t}}" for k in range(n)]
            body += ["\t}", "\treturn total"]
            out.append(f"func {fname}(items []int, limit int) int {{\n" + "\n".join(body) + "\n}\n")
        else:  # rust
            body = ["    let mut total = 0u64;", "    for item in items {"]
            body += [f"        if *item > limit.saturating_sub({k}) {{ total += item * {k + 1}; }}" for k in range(n)]
            body += ["    }", "    total"]
            out.append(f"pub fn {name}(items: &[u64], limit: u64) -> u64 {{\n" + "\n".join(body) + "\n}\n")
    return "\n".join(out)


def _module_paths(rng: random.Random, lang: str, n: int, pkg: str) -> list[str]:
    names = rng.sample(_WORDS, min(n, len(_WORDS)))
    while len(names) < n:
        names.append(f"{rng.choice(_WORDS)}{len(names)}")
    dirs = rng.sample(_DIRS, rng.randint(1, 3))
    paths = []
    for name in names:
        d = rng.choice(dirs)
        if lang == "python":
            paths.append(f"{pkg}/{d}/{name}.py" if rng.random() < 0.8 else f"{pkg}/{name}.py")
        elif lang in ("typescript", "javascript"):
            paths.append(f"src/{d}/{name}.{'ts' if lang == 'typescript' else 'js'}")
        elif lang == "go":
            paths.append(f"{d}/{name}.go")
        else:
            paths.append(f"src/{name}.rs")
    return paths


def _python_import(rng: random.Random, src: str, dst: str) -> str:
    mod = dst[:-3].replace("/", ".")
    head, _, name = mod.rpartition(".")
    if src.rsplit("/", 1)[0] == dst.rsplit("/", 1)[0] and rng.random() < 0.4:
        return f"from .{name} import {name.capitalize()}"
    return rng.choice([f"from {head} import {name}", f"import {mod}", f"from {mod} import {name.capitalize()}"])


def _es_import(rng: random.Random, src: str, dst: str, lang: str) -> str:
    a, b = src.split("/")[:-1], dst.split("/")
    common = 0
    while common < len(a) and common < len(b) - 1 and a[common] == b[common]:
        common += 1
    rel = "/".join([".."] * (len(a) - common) + b[common:])
    spec = (rel if rel.startswith("..") else "./" + rel).rsplit(".", 1)[0]
    name = b[-1].split(".")[0] + "Mod"  # never a keyword ("export")
    if lang == "javascript" and rng.random() < 0.4:
        return f'const {name} = require("{spec}");'
    return f'import {{ {name} }} from "{spec}";'


def build_repository(rng: random.Random, corpus, org: str, number: int) -> Repository:
    """One project: files, their text and the import edges between them (a DAG)."""
    lang = weighted(rng, LANG_WEIGHTS)
    name = f"{rng.choice(_WORDS)}-{number}"
    repo_id = f"{org}/{name}"
    commit = f"{rng.getrandbits(160):040x}"
    n = max(3, min(28, int(rng.lognormvariate(2.2, 0.6))))
    pkg = name.replace("-", "_")
    paths = _module_paths(rng, lang, n, pkg)
    order = list(range(len(paths)))
    rng.shuffle(order)  # topological order of the DAG (independent of path order)
    deps: dict[str, list[str]] = {p: [] for p in paths}
    if lang == "go":
        # Go imports packages (directories): a DAG over directories, every file of a package imports it
        dirs = sorted({p.rsplit("/", 1)[0] for p in paths})
        rng.shuffle(dirs)
        pdeps = {d: rng.sample(dirs[:i], min(i, rng.randint(0, 2))) for i, d in enumerate(dirs)}
        for p in paths:
            d = p.rsplit("/", 1)[0]
            deps[p] = sorted(q for q in paths if q.rsplit("/", 1)[0] in pdeps[d])
    else:
        for i, k in enumerate(order):
            earlier = [paths[j] for j in order[:i]]
            deps[paths[k]] = sorted(rng.sample(earlier, min(len(earlier), rng.choice((0, 1, 1, 2, 2, 3)))))
    files = []
    module = f"github.com/{org}/{name}"
    for p in paths:
        if lang == "python":
            lines = ["import os", "from typing import Any"] if rng.random() < 0.7 else ["import json"]
            lines += [_python_import(rng, p, d) for d in deps[p]]
            body = _python_body(rng, corpus, rng.randint(1, 6))
            text = '"""' + p + ' module."""\n' + "\n".join(lines) + "\n\n\n" + body
        elif lang in ("typescript", "javascript"):
            lines = [_es_import(rng, p, d, lang) for d in deps[p]]
            if rng.random() < 0.5:
                lines.insert(0, 'import { readFile } from "fs";')
            text = "\n".join(lines) + "\n\n" + _template_body(rng, lang, rng.randint(3, 30))
        elif lang == "go":
            pkgs = sorted({d.rsplit("/", 1)[0] for d in deps[p]})
            imp = ['\t"fmt"'] + [f'\t"{module}/{q}"' for q in pkgs]
            text = f"package {p.rsplit('/', 2)[-2]}\n\nimport (\n" + "\n".join(imp) + "\n)\n\n" + _template_body(rng, "go", rng.randint(3, 30))
        else:
            lines = ["use std::collections::HashMap;"] + [f"use crate::{d[4:-3]}::*;" for d in deps[p]]
            text = "\n".join(lines) + "\n\n" + _template_body(rng, "rust", rng.randint(3, 30))
        files.append(RepoFile(p, text, list(deps[p])))
    if lang == "rust":
        mods = sorted(p[4:-3] for p in paths)
        files.append(RepoFile("src/lib.rs", "".join(f"pub mod {m};\n" for m in mods), sorted(paths)))
    if lang == "go":
        files.append(RepoFile("go.mod", f"module {module}\n\ngo 1.22\n", []))
    return Repository(repo_id, commit, lang, files)
