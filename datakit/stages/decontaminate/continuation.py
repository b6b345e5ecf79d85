"""An item's prompt and its solution read as one program: the n-grams across the seam between them.

Why: in HumanEval-style evals the prompt is the start of the program (the
signature and its docstring, or the doc comment and the `fn` line) and the
solution continues it. A leaked copy has the two side by side, often without
the docstring (a solution file keeps the code, not the problem statement). The
item's fields are hashed separately (n-grams never cross fields), so a copy of
the signature and the first line or two of the body had no window of its own:
the signature alone is shared by any other solution (a near-miss), and a short
body alone has fewer than n tokens. The windows across the seam (the
signature's end *and* the body's start) are the item's own.

Only field pairs where one is the literal continuation of the other are joined
(`CONTINUES`); every window of a joined text is mapped back to the place
(field, byte) where it starts, so an item's places, and so the shares of the
rule, count each spot of the item once.
"""
from __future__ import annotations

from dataclasses import dataclass

# solution field -> the prompt fields it continues (HumanEval, HumanEval+, HumanEval-Rust, BigCodeBench)
CONTINUES: dict[str, tuple[str, ...]] = {"canonical_solution": ("prompt", "complete_prompt")}



@dataclass(frozen=True)
class Joined:
    """A prompt (maybe without its docstring) followed by its solution; `cut`: the solution's first byte."""

    text: str
    prompt_field: str
    solution_field: str
    cut: int
    docstring: bool = True  # False: the prompt's trailing docstring left out

    @property
    def name(self) -> str:
        """How a report names this text (its eval excerpt), e.g. `prompt+canonical_solution`."""
        return f"{self.prompt_field}{'' if self.docstring else ' without docstring'}+{self.solution_field}"


def joined_texts(fields: dict[str, str]) -> list[Joined]:
    """The joined texts of an item: prompt + solution, and, when the prompt ends in a docstring, the
    prompt without it + solution (distinct texts only)."""
    out: list[Joined] = []
    for sol, prompts in CONTINUES.items():
        if not fields.get(sol):
            continue
        for pf in prompts:
            prompt = fields.get(pf)
            if not prompt:
                continue
            heads = [(prompt, True)]
            bare = without_docstring(prompt)
            if bare is not None and bare.strip():
                heads.append((bare, False))
            for head, doc in heads:
                if not head.endswith(("\n", " ", "\t")):
                    head += "\n"  # a separator: `{` + `numbers` must stay two tokens
                out.append(Joined(head + fields[sol], pf, sol, len(head.encode()), doc))
            break
    return out


def without_docstring(prompt: str) -> str | None:
    """The prompt without the Python docstring it ends with (None when it ends with none).

    The docstring is the last triple-quoted string: from the second-to-last
    triple quote of its kind (a prompt can hold earlier functions with their own
    docstrings) back to the start of its line.
    """
    body = prompt.rstrip()
    for q in ('"""', "'''"):
        if body.endswith(q) and len(body) >= 6:
            start = body.rfind(q, 0, len(body) - 3)
            if start < 0:
                return None
            line = body.rfind("\n", 0, start) + 1
            if body[line:start].strip(" \t\"'").lstrip("rRuUbB"):
                return None  # code before the quotes on that line: not a docstring of its own
            return prompt[:line]
    return None
