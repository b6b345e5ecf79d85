"""`datakit inspect PATH`: what is in a packed dataset, readable by a human in one screen.

Why: before a multi-day training run an engineer wants to *see* the data the
trainer will see — where documents start and end inside a sequence, which
tokens carry loss, how much is padding — not only counts.

Rendering of a sequence: each segment starts on a line `── [start:end) doc
<id> +offset`; text carrying no loss is wrapped in `⟦ ⟧`; a special token (EOS, a
FIM sentinel, a chat marker) is shown in `« »`, so the same characters written as text
in a document look different; padding is shown as `<pad × n>`. Text is decoded with
the dataset's own `tokenizer.json`.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

if TYPE_CHECKING:  # numpy is imported by the functions that use it: importing the CLI must not load it
    import numpy as np

NO_LOSS_OPEN, NO_LOSS_CLOSE = "⟦", "⟧"


def _pct(a: int, b: int) -> str:
    return f"{100.0 * a / b:.2f}%" if b else "n/a"


def _summary(m: dict[str, Any], path: Path) -> list[str]:
    tok = m.get("tokenizer", {})
    t = m.get("totals", {})
    special = ", ".join(f"{k}={v['id']}" for k, v in sorted(tok.get("special_tokens", {}).items()))
    lines = [
        f"dataset   {path}",
        f"format    {m.get('format')} ({m.get('layout')}), {len(m.get('shards', []))} shards",
        f"tokenizer {tok.get('name')}  sha256 {str(tok.get('sha256'))[:16]}…  vocab {tok.get('vocab_size')}",
        f"special   {special}" + (f"  (added: {', '.join(tok['added_tokens'])})" if tok.get("added_tokens") else ""),
        f"layout    seq_len {m.get('seq_len')}  dtype {m.get('dtype')}  packing {m.get('packing', '-')}",
    ]
    if "config_hash" in m:
        lines.append(f"pipeline  config sha256 {str(m['config_hash'])[:16]}…")
    if m.get("format") in ("packed", "mds"):
        seqs, seq_len = t.get("sequences", 0), int(m.get("seq_len", 0))
        slots = seqs * seq_len
        lines += [
            f"sequences {seqs}   documents {t.get('documents', 0)}   preference pairs {t.get('preference_pairs', 0)}",
            f"tokens    {t.get('tokens', 0)} real ({_pct(t.get('tokens', 0), slots)} fill), "
            f"{t.get('padding_tokens', 0)} padding ({_pct(t.get('padding_tokens', 0), slots)}), "
            f"{t.get('loss_tokens', 0)} with loss ({_pct(t.get('loss_tokens', 0), t.get('tokens', 0))} of real)",
            f"splits    {t.get('split_documents', 0)} documents <= seq_len split "
            f"({_pct(t.get('split_documents', 0), t.get('documents', 0))}), {t.get('long_documents', 0)} longer than seq_len",
        ]
    else:
        lines.append(f"documents {t.get('documents', 0)}   tokens {t.get('tokens', 0)}   loss tokens {t.get('loss_tokens', 0)}")
    return lines


def _load_tok(path: Path, m: dict[str, Any]):
    f = path / m.get("tokenizer", {}).get("file", "tokenizer.json")
    if not f.is_file():
        return None
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(f))


def _decode(tok, ids: np.ndarray) -> str:
    """The text of `ids`, each special token (EOS, a sentinel, a chat marker) in `«»`: the same characters as
    text in a document would read alike (found in review: `x = '<|endoftext|>'` and the real EOS after it
    printed the same), and telling them apart is what one inspects for."""
    if tok is None:
        return " ".join(str(int(i)) for i in ids)
    special = _special_ids(tok)
    out, run = [], []
    for i in (int(i) for i in ids):
        if i in special:
            if run:
                out.append(tok.decode(run, skip_special_tokens=False))
                run = []
            out.append(f"{SPECIAL_OPEN}{special[i]}{SPECIAL_CLOSE}")
        else:
            run.append(i)
    if run:
        out.append(tok.decode(run, skip_special_tokens=False))
    return "".join(out)


SPECIAL_OPEN, SPECIAL_CLOSE = "«", "»"


def _special_ids(tok) -> dict[int, str]:
    """id -> text of the tokenizer's special added tokens."""
    cached = getattr(tok, "_datakit_special_ids", None)  # (once per tokenizer: _decode runs per segment)
    if cached is None:
        cached = tok._datakit_special_ids = {i: t.content for i, t in tok.get_added_tokens_decoder().items()
                                             if t.special}
    return cached


def render_tokens(tok, ids: np.ndarray, mask: np.ndarray) -> str:
    """Decode `ids`, wrapping each run of tokens without loss in ⟦ ⟧."""
    import numpy as np

    out: list[str] = []
    if len(ids) == 0:
        return ""
    change = np.nonzero(np.diff(mask.astype(np.int8)))[0] + 1
    bounds = np.concatenate([[0], change, [len(ids)]])
    for a, b in zip(bounds[:-1], bounds[1:]):
        text = _decode(tok, ids[a:b])
        out.append(text if mask[a] else f"{NO_LOSS_OPEN}{text}{NO_LOSS_CLOSE}")
    return "".join(out)


def _clip(text: str, max_chars: int) -> str:
    return text if len(text) <= max_chars else text[:max_chars] + f"… [{len(text) - max_chars} more chars]"


def inspect_dataset(path: str | Path, sequences: int = 2, max_chars: int = 1500, verify: bool = False) -> str:
    """The text `datakit inspect PATH` prints: summary + the first `sequences` sequences decoded."""
    import numpy as np

    from datakit.loader import local_folder

    if "://" in str(path) and not str(path).startswith("file://"):  # say what it is before "copy it first"
        from datakit.io.atomic import read_json

        try:
            m = read_json(f"{str(path).rstrip('/')}/manifest.json")
        except Exception:  # noqa: BLE001 - unreadable there: local_folder's line below says what to do
            m = None
        if isinstance(m, dict) and m.get("format") not in ("packed", "megatron", "mds"):
            raise ValueError(f"{path}: format {m.get('format')!r} is not a tokenized dataset (packed, megatron or mds)")
    path = local_folder(path)
    mf = path / "manifest.json"
    if not mf.is_file():
        raise FileNotFoundError(f"{path}: no manifest.json (not a finished dataset)")
    try:
        m = json.loads(mf.read_text())
    except ValueError as e:
        raise ValueError(f"{path}: manifest.json is not valid JSON ({e})") from None
    if not isinstance(m, dict):  # found in a hostile-input review: `[]` was an AttributeError, exit 3
        from datakit.io.atomic import not_an_object

        raise ValueError(f"{path}: manifest.json is damaged: {not_an_object(m)}")
    from datakit.io.atomic import manifest_shape_error

    if (wrong := manifest_shape_error(m)) is not None:  # a field of the wrong type (found in review: exit 3)
        raise ValueError(f"{path}/manifest.json is damaged: {wrong}; restore it, or write the dataset again into a "
                         "new folder")
    if isinstance(m, dict) and m.get("format") == "packed":  # what the loader will accept, said before the summary
        from datakit.loader import check_manifest

        check_manifest(m, path)
    from datakit.io.verify import verify_dataset

    verify_dataset(str(path), m, checksums=verify)  # sizes always; sha256 with --verify
    if m.get("format") not in ("packed", "megatron", "mds"):
        raise ValueError(f"{path}: format {m.get('format')!r} is not a tokenized dataset (packed, megatron or mds)")
    lines = _summary(m, path)
    tok = _load_tok(path, m)
    if tok is None and sequences > 0:
        lines.append(f"(no {m.get('tokenizer', {}).get('file', 'tokenizer.json')} in the dataset: token ids shown "
                     "instead of text)")
    if m.get("format") == "packed" and sequences > 0:
        from datakit.loader import PackedDataset

        ds = PackedDataset(path)
        for i in range(min(sequences, len(ds))):
            tokens, mask, _ = ds.raw(i)
            segs = ds.segments(i)
            trained = int(np.asarray(mask).sum())
            lines += ["", f"═══ sequence {i}: {len(segs)} segments, {trained}/{ds.seq_len} tokens with loss ═══"]
            for s in segs:
                a, b = s["start"], s["end"]
                if s["doc_id"] is None:
                    lines.append(f"── [{a}:{b}) <pad × {b - a}>")
                    continue
                lines.append(f"── [{a}:{b}) doc {s['doc_id']} +{s['doc_offset']}")
                lines.append(_clip(render_tokens(tok, np.asarray(tokens[a:b]), np.asarray(mask[a:b])), max_chars))
    elif m.get("format") == "mds" and sequences > 0:
        from datakit.stages.tokenize.mds import read_samples

        for i, smp in enumerate(read_samples(str(path / "data"), sequences)):
            ids, mask = smp["input_ids"], smp["loss_mask"]
            starts = np.append(np.flatnonzero(smp["position_ids"] == 0), len(ids))
            lines += ["", f"═══ sequence {i}: {len(starts) - 1} segments (documents start where position_ids is 0), "
                          f"{int(mask.sum())}/{len(ids)} tokens with loss ═══"]
            for a, b in zip(starts[:-1].tolist(), starts[1:].tolist()):
                lines.append(f"── [{a}:{b})")
                lines.append(_clip(render_tokens(tok, ids[a:b], mask[a:b]), max_chars))
    elif m.get("format") == "megatron" and sequences > 0:
        masks_of = m.get("loss_mask_prefixes") or []
        for k, prefix in enumerate(m.get("data_prefixes", [])[:1]):
            # the shard's loss mask dataset when it wrote one (found in review: untrained tokens were shown as
            # trained, the mask never read); null where every token carries loss
            mask_prefix = masks_of[k] if k < len(masks_of) else None
            masks = _megatron_docs(path / mask_prefix, sequences) if mask_prefix else None
            for j, ids in enumerate(_megatron_docs(path / prefix, sequences)):
                mask = masks[j] if masks is not None else np.ones(len(ids), np.uint8)
                lines += ["", f"═══ {prefix} document {j}: {len(ids)} tokens, {int(np.count_nonzero(mask))} with loss ═══",
                          _clip(render_tokens(tok, ids, mask), max_chars)]
    return "\n".join(lines)


def _megatron_docs(prefix: Path, n: int) -> list[np.ndarray]:
    """First n sequences of an MMIDIDX dataset (see writers.write_mmidx for the layout)."""
    import numpy as np

    from datakit.loader import DatasetError
    from datakit.stages.tokenize.writers import MMIDIDX_DTYPE_CODES, MMIDIDX_MAGIC

    idx = Path(f"{prefix}.idx").read_bytes()
    # found in review: a damaged header was an IndexError/StopIteration line that named no file
    try:
        if not idx.startswith(MMIDIDX_MAGIC):
            raise ValueError("not a Megatron index (no MMIDIDX header)")
        code = idx[17]
        count = int(np.frombuffer(idx, "<u8", 1, 18)[0])
        lengths = np.frombuffer(idx, "<i4", count, 34)
        pointers = np.frombuffer(idx, "<i8", count, 34 + 4 * count)
        dtype = next((d for d, c in MMIDIDX_DTYPE_CODES.items() if c == code), None)
        if dtype is None:
            raise ValueError(f"unknown token dtype code {code}")
    except (ValueError, IndexError, OverflowError) as e:
        raise DatasetError(f"{prefix}.idx is damaged: {e}") from None
    data = np.memmap(f"{prefix}.bin", dtype=dtype, mode="r") if Path(f"{prefix}.bin").stat().st_size else np.zeros(0, dtype)
    out = [np.asarray(data[p // dtype.itemsize: p // dtype.itemsize + ln]) for p, ln in zip(pointers[:n], lengths[:n])]
    if any(len(o) != ln for o, ln in zip(out, lengths[:n].tolist())):
        raise DatasetError(f"{prefix}.bin is shorter than {prefix}.idx says (damaged or truncated)")
    return out


def inspect_command(
    path: str = typer.Argument(..., help="A packed, megatron or mds dataset folder written by datakit."),
    sequences: int = typer.Option(2, "--sequences", "-n", help="How many sequences to decode and show."),
    max_chars: int = typer.Option(1500, help="Clip each decoded segment to this many characters."),
    verify: bool = typer.Option(False, "--verify", help="Also compare every data file's sha256 with the manifest."),
) -> None:
    """Show a packed dataset: manifest summary, token/document/padding stats, first sequences decoded."""
    from datakit.cli import _paths_given

    _paths_given(path)
    from datakit.io.fs import InputError
    from datakit.loader import DatasetError

    for option, value in (("--sequences", sequences), ("--max-chars", max_chars)):
        if value < 0:  # (found in a hostile-input review: -n -1 showed nothing, --max-chars -5 cut from the end)
            typer.echo(f"datakit: error: {option} must be 0 or more (got {value})", err=True)
            raise typer.Exit(2)
    try:
        text = inspect_dataset(path, sequences=sequences, max_chars=max_chars, verify=verify)
    except (FileNotFoundError, ValueError, KeyError, InputError, DatasetError) as e:
        typer.echo(f"datakit: error: {e}", err=True)
        raise typer.Exit(2) from None
    typer.echo(visible_controls(text))


_CONTROLS = {c: f"\\x{c:02x}" for c in (*range(0x00, 0x09), 0x0B, 0x0C, *range(0x0E, 0x20), 0x7F, *range(0x80, 0xA0))}


def visible_controls(text: str) -> str:
    """`text` with every control character but newline, tab and carriage return shown as `\\xNN`.

    Why: decoded training text goes to the operator's terminal, and an escape sequence in it is a
    command to the terminal (found in review: an OSC title sequence from the data retitled the window;
    OSC 52 can write the clipboard). click strips colour codes only, and only off a terminal."""
    return text.translate(_CONTROLS)
