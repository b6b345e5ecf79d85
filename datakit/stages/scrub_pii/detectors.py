"""Pattern detectors for personal data and secrets, with the validators that keep them precise on code.

Why hand-written patterns and not presidio's recognizers on the hot path: the
scanner runs every detector over every text segment of every record, so a
detector must be (a) a regex the batch scanner can prefilter in Rust (polars)
and (b) precise on source code, where hashes, UUIDs, version strings and
dotted decimals look like secrets and IPs. Each `Detector` therefore carries:

- `pattern`: the Python `re` pattern that finds a match. The sensitive span is
  the named group `v` when the pattern has one (so `password = "hunter2"`
  replaces only `hunter2` and the quotes survive), else the whole match.
- `prefilter`: a Rust-regex (polars) pattern that every true match also
  matches. Rows where it does not match are never given to Python.
- `validate`: an optional check on the match (Luhn, IBAN mod-97, entropy,
  "is this a version string?") that runs only on regex hits.

The same objects are exported as presidio recognizers by `presidio_bridge`, so
a team can extend the set the presidio way.
"""
from __future__ import annotations

import bisect
import functools
import math
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Literal

Category = Literal["pii", "secret"]
Policy = Literal["placeholder", "pseudonym", "drop"]

# A validator sees the whole match and the text around it (context checks need the line).
Validator = Callable[[re.Match[str], str], bool]


@dataclass(frozen=True)
class Detector:
    """One entity type: how to find it, how to confirm it, how to name it in output."""

    entity: str  # our name, used in config keys, metrics ("pii.<entity>") and drop reasons
    presidio_entity: str  # the entity name in presidio's vocabulary (EMAIL_ADDRESS, ...)
    category: Category
    pattern: str
    prefilter: str
    placeholder: str
    validate: Validator | None = None
    flags: int = 0
    priority: int = 50  # overlap resolution: higher wins (specific secrets beat generic rules)
    default_policy: Policy = "placeholder"
    score: float = 0.85  # presidio confidence for the bridge
    # False (all but PEM blocks): pattern and prefilter never match a newline, so the scanner
    # may run the Python pattern on single candidate lines instead of the whole text
    multiline: bool = False
    # optional: False for a prefilter hit that can not lead to a validated match (skips the Python scan)
    hit_filter: Callable[[str], bool] | None = None
    compiled: re.Pattern[str] = field(init=False, repr=False, compare=False)
    rust_prefilter: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "compiled", re.compile(self.pattern, self.flags | re.ASCII))
        object.__setattr__(self, "rust_prefilter", _ascii_classes(self.prefilter))

    def span(self, m: re.Match[str]) -> tuple[int, int]:
        """The part of a match that is sensitive (group `v` if present)."""
        gi = m.re.groupindex
        for g in ("v", "v2", "v3", "v4"):
            if g in gi and m.group(g) is not None:
                return m.span(g)
        return m.span()

    def finditer(self, text: str, pos: int = 0, endpos: int | None = None):
        """Validated matches of this detector in `text[pos:endpos]` (lookbehinds still see before `pos`),
        then those found only in `escape_view(text)` (same offsets)."""
        end = len(text) if endpos is None else endpos
        view = None if self.multiline else escape_view(text)
        if view is None:
            for m in self.compiled.finditer(text, pos, end):
                if self.validate is None or self.validate(m, text):
                    yield m
            return
        for _, m in prefer_view_spans([(m.span(), m) for m in self.compiled.finditer(view, pos, end)
                                       if self.validate is None or self.validate(m, view)],
                                      [(m.span(), m) for m in self.compiled.finditer(text, pos, end)
                                       if self.validate is None or self.validate(m, text)]):
            yield m


# letters of Latin-1/Latin Extended (without the multiplication and division signs), Greek and Cyrillic
_LOCAL_LETTERS = "\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u024f\u0370-\u03ff\u0400-\u04ff"


def _ascii_classes(p: str) -> str:
    """`\\d`/`\\w`/`\\s` -> ASCII classes for Rust's regex, whose Unicode classes make the DFA 2-5x slower.

    The Python patterns compile with `re.ASCII`, so both sides mean the same classes.
    """
    return (p.replace(r"\d", "[0-9]").replace(r"\w", "[A-Za-z0-9_]").replace(r"\s", r"[\t\n\v\f\r ]"))


# ---------------------------------------------------------------- validators


def luhn_ok(digits: str) -> bool:
    """The Luhn checksum every payment card number satisfies."""
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = ord(ch) - 48
        if i % 2 == 1:
            d *= 2
            if d > 9:
                d -= 9
        total += d
    return total % 10 == 0


# IBAN lengths per country (ISO 13616 registry); a wrong length is not an IBAN.
IBAN_LENGTHS: dict[str, int] = {
    "AD": 24, "AE": 23, "AL": 28, "AT": 20, "AZ": 28, "BA": 20, "BE": 16, "BG": 22, "BH": 22,
    "BR": 29, "BY": 28, "CH": 21, "CR": 22, "CY": 28, "CZ": 24, "DE": 22, "DK": 18, "DO": 28,
    "EE": 20, "EG": 29, "ES": 24, "FI": 18, "FO": 18, "FR": 27, "GB": 22, "GE": 22, "GI": 23,
    "GL": 18, "GR": 27, "GT": 28, "HR": 21, "HU": 28, "IE": 22, "IL": 23, "IQ": 23, "IS": 26,
    "IT": 27, "JO": 30, "KW": 30, "KZ": 20, "LB": 28, "LC": 32, "LI": 21, "LT": 20, "LU": 20,
    "LV": 21, "MC": 27, "MD": 24, "ME": 22, "MK": 19, "MR": 27, "MT": 31, "MU": 30, "NL": 18,
    "NO": 15, "PK": 24, "PL": 28, "PS": 29, "PT": 25, "QA": 29, "RO": 24, "RS": 22, "SA": 24,
    "SC": 31, "SE": 24, "SI": 19, "SK": 24, "SM": 27, "ST": 25, "SV": 28, "TL": 23, "TN": 24,
    "TR": 26, "UA": 29, "VA": 22, "VG": 24, "XK": 20,
}


def iban_ok(raw: str) -> bool:
    """Country length + ISO 7064 mod-97 == 1."""
    s = raw.replace(" ", "").replace("-", "")
    if IBAN_LENGTHS.get(s[:2]) != len(s):
        return False
    moved = s[4:] + s[:4]
    num = "".join(str(int(c, 36)) for c in moved)
    return int(num) % 97 == 1


_C_LOG2_C = [0.0] + [c * math.log2(c) for c in range(1, 257)]  # c*log2(c), looked up (validators run per candidate)


def shannon_entropy(s: str) -> float:
    """Bits per character of `s` (a random base64 string of 32 chars is ~4.5-5).

    Computed as log2(n) - sum(c*log2(c))/n over the character counts c, with
    c*log2(c) from a table: the same value as -sum(p*log2(p)) up to rounding.
    """
    n = len(s)
    if n == 0:
        return 0.0
    counts = Counter(s).values()
    total = sum(map(_C_LOG2_C.__getitem__, counts)) if n < 257 else sum(c * math.log2(c) for c in counts)
    return round(max(0.0, math.log2(n) - total / n), 12)  # rounded: float noise must not flip a threshold


_HEX = re.compile(r"[0-9a-fA-F]+")
_UUID = re.compile(r"[0-9a-fA-F]{8}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{12}")
# A value that stands for a secret rather than being one: a whole template, reference or mask. Each shape is
# the whole value: found in review, the shapes matched as prefixes, so `$ecureP4ss!2024`, `*K9mQ2vR7tLp`,
# `(Pr0dDbPass9`, `xxxHunter2Prod!`, `my-Pr0d-Pa55word!` and `{Sunshine42}` were taken for placeholders
# and kept (assignments and URL credentials alike).
_PLACEHOLDER_VALUE = re.compile(
    r"""^(?:\$\{[^{}]*\}|\$\([^()]*\)|\$[A-Za-z_]\w*|%\(?\w*\)?[sdrif]|%[sdrif]|\{\{?[^{}]*\}?\}|<[^<>]*>|
    \[[^\[\]]*\]|\([^()]*\)|[xX*.#-]{3,}|\.\.\..*|
    changeme|change_me|password|passwd|secret|token|
    none|null|nil|true|false|undefined|example|dummy|test|testing|redacted|hidden|(?:your|my)[_-][a-z_-]*|
    placeholder|todo|tbd|fixme|env|required|optional|string|str|bytes|int|\w+_here)$""",
    re.IGNORECASE | re.VERBOSE,
)


def _line_of(text: str, start: int, end: int) -> str:
    a = text.rfind("\n", 0, start) + 1
    b = text.find("\n", end)
    return text[a : b if b >= 0 else len(text)]


_VERSION_CONTEXT = re.compile(r"(?:\bv(?:er)?|==|>=|<=|~=|!=|\^|~)\s*$", re.IGNORECASE)
# loopback, unspecified, netmasks, link-local, and the RFC 5737 documentation ranges
# (192.0.2.0/24 etc. are reserved for examples: they name no host and no person)
_NOT_PUBLIC_V4 = ("0.", "127.", "255.", "169.254.", "192.0.2.", "198.51.100.", "203.0.113.")


def ipv4_ok(m: re.Match[str], text: str) -> bool:
    """Reject loopback/netmask/unspecified addresses and version strings (`__version__ = "1.2.3.4"`)."""
    ip = m.group()
    if ip.startswith(_NOT_PUBLIC_V4) or ip == "1.2.3.4" or int(ip.split(".", 1)[0]) >= 224:
        return False  # reserved/doc ranges, the classic placeholder, multicast and class E
    if ip.endswith(".0") and re.match(r"/\d{1,2}\b", text[m.end() : m.end() + 3]):
        return False  # a network range (10.0.0.0/8) names no host
    line = _line_of(text, m.start(), m.end())
    if _names_a_version(text, m.start()):
        return False
    before = text[max(0, m.start() - 12) : m.start()]
    if _VERSION_CONTEXT.search(before.rstrip("\"' (")):
        return False
    if re.search(r"\bsections?\b|§", line[: m.start() - text.rfind("\n", 0, m.start()) - 1], re.IGNORECASE):
        return False  # spec section numbers: "section 8.2.4.44"
    return True


def ipv6_ok(m: re.Match[str], text: str) -> bool:
    """Real IPv6 addresses have >= 3 groups and a digit; `::1` and C++ `Abc::Def` do not count."""
    ip = m.group()
    groups = [g for g in ip.split(":") if g]
    if len(groups) < 3 or not any(c.isdigit() for c in ip):
        return False
    low = ip.lower()
    if low in ("::1", "::", "0:0:0:0:0:0:0:1") or low.startswith("2001:db8:"):
        return False  # loopback and the RFC 3849 documentation prefix
    if set(low) <= set("f0:"):
        return False  # netmasks and the IPv4-mapped prefix (ffff:ffff:..., ::ffff:0:0)
    if "::" not in ip and len(groups) != 8 and "." not in groups[-1]:
        return False
    return True


def card_ok(m: re.Match[str], text: str) -> bool:
    digits = re.sub(r"\D", "", m.group())
    if not 13 <= len(digits) <= 19 or not luhn_ok(digits):
        return False
    # brand prefixes (IIN ranges); timestamps and IDs rarely start like a card
    return bool(re.match(r"4|5[0-5]|2[2-7]|3[47]|6(?:011|5|4[4-9]|2|304|7(?:59|6[1-3]))|3(?:0[0-5]|[68])|35", digits))


def iban_match_ok(m: re.Match[str], text: str) -> bool:
    return iban_ok(m.group())


@functools.lru_cache(maxsize=4096)
def _e164_valid(number: str) -> bool:
    import phonenumbers  # a presidio-analyzer dependency; imported on the first separator-less candidate
    try:
        return phonenumbers.is_valid_number(phonenumbers.parse(number, None))
    except phonenumbers.NumberParseException:
        return False


def phone_ok(m: re.Match[str], text: str) -> bool:
    """10-15 digits, and a North-American number must have a valid area code / exchange."""
    digits = re.sub(r"\D", "", m.group())
    if not 10 <= len(digits) <= 15:
        return False
    if m.group() == "+" + digits:
        # E.164 without separators (+14155552671) looks like a signed integer in code (+4294967296):
        # accept it only when libphonenumber knows the country code and number plan
        return _e164_valid(m.group())
    if not m.group().startswith("+") and len(digits) == 10:
        if digits[0] in "01" or digits[3] in "01":
            return False
    if _names_a_version(text, m.start()):
        return False
    return True


_VERSION_WORD = re.compile(r"(?:version|release)\w*\W{0,4}(?:[\w.-]+\W{0,3})?$", re.IGNORECASE)


def _names_a_version(text: str, start: int) -> bool:
    """A version or release word just before the number (`version: 10.0.19041.1234`, `"release": "2024.1.15.3"`,
    `version is 1.2.3.4`), on its line.

    Why not anywhere on the line: every editor event has a `client_version` key, so a quarantined line lost
    all phone and IPv4 detection, and a chat turn that said "version" anywhere kept its phone numbers and
    addresses (found in review)."""
    a = text.rfind("\n", 0, start) + 1
    return bool(_VERSION_WORD.search(text[max(a, start - 40) : start]))


def user_ok(m: re.Match[str], text: str) -> bool:
    """Generic account names (`/home/user`, `C:\\Users\\Public`) are not personal."""
    return m.group("v").lower() not in _GENERIC_USERS


_GENERIC_USERS = frozenset(
    "user username users me you your_name yourname name shared public default guest root admin "
    "runner travis circleci jenkins ubuntu ec2-user vagrant nobody all default user "
    "someone somebody foo bar baz example test tester docker app www-data postgres".split()
)


_NUMBER = re.compile(r"[\d.]+")
_IDENT = re.compile(r"[A-Za-z_]\w*")


_CALL = re.compile(r"[A-Za-z_][\w]*\(")


def param_ok(v: str, code: bool = False) -> bool:
    """A credential's value, not a template (`${PASS}`, `{token}`, `<token>`), a placeholder or a call;
    `code`: not in a URL's query, where `password=self.password` is a keyword argument (measured on the
    standard library: 12 such matches in 161 MB before this rule, none after)."""
    v = v.strip()
    if _PLACEHOLDER_VALUE.match(v) or len(set(v)) < 4 or _CALL.match(v) or v.startswith(("$", "{", "%", "<")):
        return False
    if code and _DOTTED.fullmatch(v):
        return False
    return not (_IDENT.fullmatch(v) and not _DIGIT.search(v))  # `token=next_token`: a name, not a value


def credential_param_ok(m: re.Match[str], text: str) -> bool:
    return param_ok(m.group("v"), code=text[m.start()] not in "?&;")


def auth_header_ok(m: re.Match[str], text: str) -> bool:
    return token_ok(m.group("v"))


_CURL = re.compile(r"\bcurl\b", re.ASCII)
_MYSQL = re.compile(r"\bmysql(?:dump|admin)?\b", re.ASCII)


_SSHPASS_OR_DOCKER_LOGIN = re.compile(r"(?<![\w-])(?:sshpass|docker[ \t]+login)(?![\w-])")
_REDIS_CLI = re.compile(r"(?<![\w-])redis-cli(?![\w-])")


def _command_line_before(text: str, pos: int) -> str:
    r"""The shell command `pos` is in, up to `pos`: its line and the lines before it that end in a `\`
    continuation (found in review: `curl https://api.x.io \`, then `-u deploy:...` on the next line, was kept)."""
    start = text.rfind("\n", 0, pos) + 1
    while start > 0:
        end = start - 2 if start >= 2 and text[start - 2] == "\r" else start - 1  # the char before the break
        if end < 1 or text[end - 1] != "\\":
            break
        start = text.rfind("\n", 0, start - 1) + 1
    return text[start:pos]


def cli_password_ok(m: re.Match[str], text: str) -> bool:
    """A `-u user:pass` needs `curl` and a `-pPASS` needs `mysql` earlier on its line.

    Why a look back instead of `curl.*?-u` in the pattern: a pattern that starts at the command
    consumes the line up to the first credential, so a second `curl -u` glued to the first
    (`.../apicurl -u a:b`, no word boundary before it) was found only once the first had become
    `<SECRET>`: the scrub was not idempotent (found by hypothesis).
    """
    if m.group("v3") is not None:
        return param_ok(m.group("v3"))
    line = _command_line_before(text, m.start())
    if m.group("v4") is not None:
        flag = m.group(0).lstrip()[:2]
        if flag == "--":
            return param_ok(m.group("v4"))
        command = _SSHPASS_OR_DOCKER_LOGIN if flag == "-p" else _REDIS_CLI
        return command.search(line) is not None and param_ok(m.group("v4"))
    command = _CURL if m.group("v") is not None else _MYSQL
    return command.search(line) is not None and param_ok(m.group("v") or m.group("v2"))


def token_ok(v: str) -> bool:
    """A header's credential: letters and digits (or base64 padding), not a word of prose or a name."""
    return bool(_DIGIT.search(v)) and bool(re.search(r"[A-Za-z]", v)) and not _PLACEHOLDER_VALUE.match(v)


def assignment_ok(m: re.Match[str], text: str) -> bool:
    """A literal credential, not an env lookup, a prompt string, or a placeholder."""
    v = m.group("v") if m.group("v") is not None else m.group("v2")
    if _PLACEHOLDER_VALUE.match(v) or len(set(v)) < 3:
        return False
    if m.group("v") is None:
        # unquoted: `token = next_token`, `pwd = self.pwd`, `n = 100000` are code, not secrets
        if "." in v or _CALL.match(v) or _NUMBER.fullmatch(v):  # `hash(x)+salt` is code; `k8#n2(u)i_o+a=s` not
            return False
        if v.count(")") > v.count("("):  # the end of a signature or call: `def f(password=None):`
            return False
        if _IDENT.fullmatch(v) and not _DIGIT.search(v):
            return False
    if " " in v.strip() and len(v.split()) > 2:  # prose: "Enter your password"
        return False
    return True


_ENTROPY_KEY_SKIP = re.compile(
    r"hash|sha\d*|md5|digest|checksum|uuid|guid|commit|revision|version|integrity|etag|"
    r"path|file|dir|url|uri|name|title|label|format|fmt|pattern|regex|template|msg|message|"
    r"doc|help|description|text|encoding|charset|alphabet|chars|letters|digits|mode",
    re.IGNORECASE,
)


_SHA_PREFIX = re.compile(r"sha\d+-")
_LOWER, _UPPER, _DIGIT, _DIGITS2 = re.compile(r"[a-z]"), re.compile(r"[A-Z]"), re.compile(r"\d"), re.compile(r"\d{2}")
_DOTTED = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+")
_PATHLIKE = re.compile(r"[\w.-]*(?:/[\w.-]+)+/?")
_LOWER_RUN = re.compile(r"[a-z]{7,}")
_CAMEL = re.compile(r"[A-Z][a-z]{2,}")
_VOWEL = re.compile(r"[aeiouy]")


def high_entropy_ok(m: re.Match[str], text: str) -> bool:
    """Random-looking token in an assignment: mixed case, high entropy, not hex/UUID/path/identifier.

    Checks run cheapest and most often decisive first (hex digests are the common case in code).
    """
    v = m.group("v")
    if _HEX.fullmatch(v) or v[0] in "/.~" or "://" in v:  # digests, paths, URLs
        return False
    if v.lower() == v or v.upper() == v:  # one case only (the token class is ASCII)
        return False
    if _ENTROPY_KEY_SKIP_LOWER.search(m.group("k").lower()) or _UUID.fullmatch(v) or _SHA_PREFIX.match(v):
        return False
    has_digit = _DIGIT.search(v) is not None
    if not has_digit and (len(v) < 20 or shannon_entropy(v) < 4.2):
        return False  # letters only: must be long and very mixed to be a token rather than a word
    if "." in v and _DOTTED.fullmatch(v):  # dotted module path
        return False
    if "/" in v and _PATHLIKE.fullmatch(v) and not _DIGITS2.search(v):
        return False
    # long pronounceable runs of letters are words (identifiers), not random tokens
    if any(sum(map(w.count, "aeiou")) >= 0.3 * len(w) for w in _LOWER_RUN.findall(v)):
        return False
    camel_words = [w for w in _CAMEL.findall(v) if _VOWEL.search(w, 1)]
    if sum(map(len, camel_words)) >= 0.6 * len(v):  # SomeLongClassName2: an identifier
        return False
    # a random 24-char token scores ~4.2 bits/char, but short samples vary: the bar follows the length
    return shannon_entropy(v) >= min(4.0, math.log2(len(v)) - 0.85)


_HIT_TOKEN = re.compile(r"([A-Za-z0-9+/=_.-]*)[\"'`]$")


def high_entropy_hit(hit: str) -> bool:
    """Cheap pre-check on a prefilter hit `= "TOKEN"`: the validator rejects hex, UUIDs and one-case tokens.

    The Python pattern's value is exactly the text between the hit's quotes (the
    token class excludes quotes), so dropping such hits changes no result.
    """
    m = _HIT_TOKEN.search(hit)
    tok = m.group(1) if m else ""
    if _HIDES_HIT.search(tok):
        # `x='aaaa...key='AbC...'`: a leftmost hit whose token ends in `=` ends at the quote that opens
        # the real token, so a non-overlapping prefilter pass reports only this one: keep its line
        return True
    return not (_HEX.fullmatch(tok) or _UUID.fullmatch(tok)) and bool(_LOWER.search(tok) and _UPPER.search(tok))


_HIDES_HIT = re.compile(r"=[rbuRBU]{0,2}$")


def url_creds_ok(m: re.Match[str], text: str) -> bool:
    pw = m.group("v").split(":", 1)[1]
    return not _PLACEHOLDER_VALUE.match(pw)


def ssn_ok(m: re.Match[str], text: str) -> bool:
    area, group, serial = m.group().split("-")
    return area not in ("000", "666") and area[0] != "9" and group != "00" and serial != "0000"


# ---------------------------------------------------------------- the detector set

# A `\n`, `\t` or `\r` escape written out in a text (JSON: extract renders a tool call's arguments with
# json.dumps, so every line an agent wrote into a file starts after one; a string literal in code) ends
# in a letter, so a token boundary after it failed and a key or address starting the next line was kept
# in clear (found in review: OpenAI/Stripe/Slack keys, JWTs, IPs, card numbers after `\n`). Each
# detector also runs on a view of the text with the escape's letter replaced by a mark that is no word
# character (same length: same offsets); a match found only there counts too. Not instead of the text:
# `C:\Users\nancy` is a path whose user name starts with the `n`.
_ESCAPE_MARK = "\uf8ff"
_TEXT_ESCAPE = re.compile(r"(?<!\\)\\[ntr]")


def line_escape_view(text: str) -> str | None:
    """`text` with each `\n`/`\t`/`\r` escape's letter replaced by a non-word mark, or None if it has none."""
    if "\\" not in text:
        return None
    view = _TEXT_ESCAPE.sub("\\\\" + _ESCAPE_MARK, text)
    return None if view == text else view


# whole texts: the reference scan asks for the same text's view once per detector
escape_view = functools.lru_cache(maxsize=64)(line_escape_view)


def prefer_view_spans(in_view: list, in_text: list) -> list:
    r"""`[((start, end), match), ...]` of the escape view, then those of the text that overlap none of
    them, by position. Why the view first: in `\tjane@x.org` the text's match takes the escape's `t` as
    part of the address, and its replacement broke the escape (`\<EMAIL>`)."""
    spans = sorted(sp for sp, _ in in_view)
    starts = [a for a, _ in spans]
    out = list(in_view)
    for (a, b), m in in_text:
        i = bisect.bisect_right(starts, a)
        if (i > 0 and spans[i - 1][1] > a) or (i < len(spans) and spans[i][0] < b):
            continue
        out.append(((a, b), m))
    return sorted(out, key=lambda x: x[0])


_B = r"(?<![A-Za-z0-9_])"  # token start (like \b but also before `_`-joined words)
_E = r"(?![A-Za-z0-9_])"


def _case_variants(words: list[str]) -> str:
    """lower / UPPER / Capitalized / camelCase / PascalCase forms of snake words, as one alternation.

    Why not `(?i)`: a case-sensitive literal alternation lets the Rust prefilter
    use its SIMD multi-literal search (GB/s) instead of a lazy DFA (~200 MB/s),
    and the Python pattern uses the same set, so the prefilter stays a superset.
    """
    forms: set[str] = set()
    for w in words:
        parts = re.split(r"[_-]", w)
        for sep in ("_", "-", ""):
            joined = sep.join(parts)
            forms |= {joined, joined.upper(), joined.capitalize(), sep.join(p.capitalize() for p in parts)}
        forms.add(parts[0] + "".join(p.capitalize() for p in parts[1:]))
    return "|".join(sorted(forms, key=lambda f: (-len(f), f)))


def _trie_regex(words: list[str]) -> str:
    """One regex matching exactly `words`, as a trie (`A(?:uthor(?:s)?|...)`), not a flat alternation.

    Why: Python's `re` tries a flat alternation's branches one by one at every
    position of a candidate line; a trie shares prefixes, so a position that
    starts no keyword fails after one character (the person pattern's ~250
    keywords ran 2x faster this way).
    """
    root: dict = {}
    for w in words:
        node = root
        for ch in w:
            node = node.setdefault(ch, {})
        node[""] = {}

    def emit(node: dict) -> str:
        alts = [re.escape(ch) + emit(node[ch]) for ch in sorted(k for k in node if k)]
        if not alts:
            return ""
        body = alts[0] if len(alts) == 1 and "" not in node else "(?:" + "|".join(alts) + ")"
        return body + "?" if "" in node else body

    return "(?:" + emit(root) + ")"


# the same words as `_ENTROPY_KEY_SKIP`, as a trie over the lower-cased key: Python's `re` runs a
# case-insensitive alternation of ~45 words at every position of the key (1/3 of the validator's time)
_ENTROPY_KEY_SKIP_LOWER = re.compile(_trie_regex(
    _ENTROPY_KEY_SKIP.pattern.replace(r"sha\d*", "sha").replace("|\n", "|").split("|")))


_SECRET_KEYWORDS = _case_variants([
    "password", "passwd", "pwd", "secret", "token", "api_key", "access_key", "auth_key", "client_secret",
    "private_key", "credential", "credentials", "passphrase", "passwort", "signing_key", "encryption_key",
])
# short keywords, only as a word of their own (`DB_PASS`, `pw`; not `compass`, `bypass`, `passing`): found in
# review, `.env` lines such as `DB_PASS=...` were kept
_SHORT_SECRET_KEYWORDS = r"(?<![A-Za-z])(?:pass|Pass|PASS|pw|Pw|PW)(?![A-Za-z])"
# what may follow a keyword in a variable's name: `_KEY`/`_HASH`..., then an environment or a number
# (found in review: `DB_PASSWORD_PROD`, `password2`, `GITHUB_TOKEN_2` were kept)
_SECRET_KEY_SUFFIX = (r"(?i:[_-]?(?:key|value|str|string|hash))?"
                      r"(?:[_-]?(?i:prod|production|dev|stage|staging|test|live|old|new)(?![a-z])|[_-]?\d{1,3})?")


# ---------------------------------------------------------------- person names in code contexts
#
# Why patterns and not NER for code: NER costs ~1000x the pattern pass, and in source code a
# person's name almost always sits in a recognizable context (an author line, a copyright
# holder, a git trailer, "Written by", `TODO(name)`). The detector finds the context with a
# literal-led prefilter, and the validator keeps only name-shaped values: capitalized words of
# letters (Unicode Latin/Greek/Cyrillic: José Müller, Marc-André, O'Brien, Guido van Rossum,
# Fred L. Drake, Jr.), not organizations, placeholders or code identifiers. Only the name is the
# sensitive span (`# Author: <PERSON>`); a list of names ("Jane Doe, Bob Roe and Ann Lee") is one.

# letters a name may hold; the pattern compiles with re.ASCII, so they are spelled out as ranges
# (Latin-1, Latin Extended-A/B, Greek, Cyrillic, Latin Extended Additional)
_NL = "A-Za-z\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u024f\u0370-\u03ff\u0400-\u04ff\u1e00-\u1eff"
_NU = "A-Z\u00c0-\u00d6\u00d8-\u00de\u0100-\u024f\u0391-\u03a9\u0400-\u042f\u1e00-\u1eff"  # may start a name word
_NAME_WORD = rf"(?:[{_NU}]\.(?:[{_NU}]\.){{0,2}}|[{_NU}](?:[{_NL}]|['\u2019-](?=[{_NL}]))*)"
_PARTICLE = r"(?:van|von|der|den|de|del|della|di|da|du|dos|das|le|la|ten|ter|bin|ibn|al|el|y|v\.)"
_ONE_NAME = (rf"{_NAME_WORD}(?:[ \t](?:{_PARTICLE}[ \t])*{_NAME_WORD}){{0,3}}"
             r"(?:,?[ \t](?:Jr|Sr)\.?|[ \t](?:II|III|IV)(?![A-Za-z]))?")
# words that end a list of names ("Jane Doe, All rights reserved", "Jane Doe, Inc.")
_LIST_STOP = r"(?:All|Inc|LLC|Ltd|Corp|Co|GmbH|AG|AB|Licensed|Released|Version|The|See)(?![A-Za-z])"
_NAME_LIST = (rf"{_ONE_NAME}(?:(?:,[ \t]*|[ \t]+(?:and|&)[ \t]+)(?!{_LIST_STOP})"
              rf"{_NAME_WORD}(?:[ \t](?:{_PARTICLE}[ \t])*{_NAME_WORD}){{1,3}}){{0,5}}")
_NAME_END = rf"(?![{_NL}0-9_@\\])"  # not cut inside a word, nor before an escape (`Gust\u00e4bel`)
# a handle in `TODO(jdoe)`: letters and digits, no `_` or `.` (identifiers) and no `-` (tags)
_HANDLE = r"[A-Za-z][A-Za-z0-9]{1,38}(?![A-Za-z0-9_.-])"

# `Author: Jane Doe`, `"author": "Jane Doe"`, `__author__ = 'Jane Doe'`, `Signed-off-by: Jane Doe`
_PERSON_KEYS = _case_variants([
    "author", "authors", "maintainer", "maintainers", "contributor", "contributors", "co_author", "co_authors",
    "author_name", "maintainer_name", "original_author", "moduleauthor", "sectionauthor", "codeauthor",
]) + "|__author__|__maintainer__|__credits__|__contributors__|" + "|".join(  # `Last-Translator:` (gettext)
    f for f in _case_variants(["translator", "last_translator"]).split("|") if not f.isupper())
# git trailers and `*_by` keys (`Signed-off-by:`, `reported_by = "..."`): `-`/`_`-joined forms only,
# so every one ends in a `-by`/`_by` literal the prefilter can search for
_BY_KEYS = "|".join(sorted({
    f for w in ("signed_off_by", "co_authored_by", "reviewed_by", "reported_by", "tested_by", "acked_by",
                "suggested_by", "helped_by", "created_by", "written_by", "maintained_by")
    for sep in ("-", "_") for p in [w.split("_")]
    for f in (sep.join(p), sep.join(p).upper(), sep.join(p).capitalize(), sep.join(x.capitalize() for x in p))
}, key=lambda f: (-len(f), f)))
# `Written by Jane Doe`, `# Maintained by ...`: a credit verb, then "by". Each verb ends in one of the
# stems the prefilter searches for. Why so few: with more than ~36 literals Rust's SIMD multi-literal
# search gives way to a slower one (the pass took 2x as long); a bare " by Name" context found more
# names but cost 2.5% more of the stage and was 0.96 precise on real code, not ~1.0.
_BY_VERBS = ["written", "rewritten", "created", "contributed", "maintained", "developed", "modified", "adapted",
             "suggested", "submitted", "implemented"]
_BY_STEMS = ["ritten", "reated", "ontributed", "aintained", "eveloped", "odified", "dapted", "uggested",
             "ubmitted", "mplemented"]
_BY_PHRASES = sorted({f(v) for v in _BY_VERBS for f in (str.lower, str.capitalize)})
_TODO_TAGS = "TODO|FIXME|XXX|NOTE"
_COPYRIGHT = "Copyright|copyright"  # (an all-caps COPYRIGHT line holds no capitalized name either)
# `Copyright © 2021 Jane Doe`; a bare `© 2021 Jane Doe` is not read: a non-ASCII literal in the
# prefilter made the whole Rust pass 4x slower
_COPY_SIGN = "\u00a9"
_YEARS = r"(?:(?:\d{4}(?:[ \t]*[-\u2013,][ \t]*(?:\d{2,4}|present))*|present)[,.]?[ \t]*)?"

_PERSON_PATTERN = (
    r"(?<![A-Za-z0-9])(?:(?:"
    rf"{_trie_regex((_PERSON_KEYS + '|' + _BY_KEYS).split('|'))}"
    r"[\"']?[ \t]*(?:::?|=>|=(?!=))[ \t]*(?:[\[({][ \t]*)?(?:[rRuUbB]?[\"'`])?[ \t]*"
    r"|@(?:author|maintainer)[ \t]+(?=[A-Z])"
    rf"|{_trie_regex(_BY_PHRASES)}[ \t]+(?:by|By|BY)(?:[ \t]*:)?[ \t]+"
    rf"|(?:{_COPYRIGHT})(?:[ \t]*(?:\([cC]\)|{_COPY_SIGN}))?[ \t]*{_YEARS}"
    r"(?:(?:by|By)[ \t]+)?"
    rf")(?=[{_NU}])"  # outside `TODO(...)` a name starts with a capital: no regex match, no validator call
    rf"|(?P<todo>(?:{_TODO_TAGS})\([ \t]*@?)"
    rf")(?P<v>{_NAME_LIST}{_NAME_END}|{_HANDLE})"
)
# 30 short literals, each leading its branch (see _BY_STEMS for why few). Every key above holds
# uthor/aintainer/ontributor/ranslator (then at most 6 letters: `co_authored_by`, `author_name`) or
# ends in -by/_by, and every credit verb ends in a stem (tested).
_PERSON_PREFILTER = (
    # (`@author Jane` is read by the first branch too: "uthor" + spaces + a capital)
    r"(?:uthor|UTHOR|aintainer|AINTAINER|ontributor|ONTRIBUTOR|ranslator|__credits__)"
    r"(?:[A-Za-z_-]{0,6}[\"']?[ \t]*[:=]|[ \t]+[A-Z])"
    r"|(?:-by|-By|-BY|_by|_By|_BY)[\"']?[ \t]*[:=]"
    rf"|(?:{'|'.join(_BY_STEMS)})[ \t]+(?:by|By|BY)"
    rf"|{_COPYRIGHT}|(?:{_TODO_TAGS})\("
)

# capitalized words that are not names (a placeholder, a title word, a product) - lower case
_NOT_NAME_WORDS = frozenset("""
the this that these those all any some every each no none not other others various many more
your my our their his her its you we they me us i name names first last full middle firstname lastname
surname given family author authors user username users someone somebody anyone anybody nobody
everyone everybody unknown anonymous anon example examples sample test tests testing foo bar baz qux
dummy fake placeholder todo fixme see note copyright rights reserved license licensed licence version
release and or of for from by with in on at to into per via under over after before since until new old
original initial modified updated generated automatically auto code source software program script
module modules package library tool tools generator file files system data python java javascript
django sphinx pytest doxygen linux unix windows mac macos ios android git github gitlab sun thanks
hello world dear sir madam mr mrs ms dr prof standard support admin info contact sales team help noreply
webmaster postmaster root owner maintainer maintainers contributor contributors developer developers
staff guest default nan none null true false yes ok error warning free open public private
mail mailer mailing delivery daemon subsystem service server bot robot notification notifications
newsletter list lists
""".split())
# words that make the span an organization (any word of it) - lower case
_ORG_WORDS = frozenset("""
inc incorporated llc llp ltd limited gmbh ag ab sa sas srl spa bv nv oy kk pty plc co corp corporation
company foundation stichting association society institute institution university universit\u00e4t
college school academy laboratory laboratories lab labs group team teams project projects community
consortium organization organisation committee council center centre department dept agency ministry
government systems technologies technology solutions services networks network industries enterprises
partners holdings media studio studios games research initiative initiatives alliance federation trust
fund office bank hospital museum press publishing club authors contributors developers maintainers
python google microsoft apple mozilla apache ibm oracle amazon facebook meta intel nvidia netscape
beopen cnri psf zope digital creations mathematisch centrum secret
""".split())
# lower-case words seen in `TODO(...)` that are tags, not people (a handle must not be one)
_NOT_HANDLES = _NOT_NAME_WORDS | frozenset("""
fix fixes bug bugs perf performance speed optimize optimization cleanup clean refactor refactoring later
soon someday maybe eventually future next now urgent important critical high low medium minor major
security safety docs doc documentation typing types type typo mypy lint style format formatting compat
compatibility deprecate deprecated deprecation remove removal delete migrate migration upgrade update
hack hacky temp tmp temporary wip experimental unstable stable beta alpha api ui ux cli gui web http
https server client backend frontend db sql async sync thread threads threading memory leak cache
config configuration settings logging log logs debug tracing metrics test unittest xfail skip flaky
windows linux mac osx posix unicode utf ascii bytes str string int float list dict tuple set object
self cls args kwargs value values key keys item items node nodes error errors exception exceptions
handle handler handling check checks validate validation verify assert unassigned unknown anyone someone
everyone nobody team owner me myself us them him her here there this that it what why how when where
review reviewer question questions idea ideas discuss discussion design decide decision investigate
followup cython numpy pandas torch tensorflow jax scipy arrow spark python pypy jython ironpython
compiler interpreter parser lexer runtime kernel driver extension extensions plugin plugins dataset
datasets model models nullable optional required dynamic static generic generics inline inlining
infer inference export import imports package packaging build release version versions platform
support supported unsupported implement implementation feature features enhancement improve improvement
correctness edge edgecase corner rare sanity legacy old new original port porting backport rewrite
""".split())
_WORD_PARTS = re.compile(r"['\u2019-]")
_CAMEL_PREFIX = re.compile(r"(?:Mc|Mac|O'|O\u2019|D'|D\u2019|De|Di|Da|Du|La|Le|Van|Von|Fitz)[A-Z\u00c0-\u00de]")
_NAME_SUFFIX = re.compile(r",?[ \t](?:Jr|Sr)\.?$|[ \t](?:II|III|IV)$")
_LIST_SPLIT = re.compile(r",[ \t]*|[ \t]+(?:and|&)[ \t]+")
_SUFFIX_WORDS = frozenset(("Jr", "Jr.", "Sr", "Sr.", "II", "III", "IV"))
_PARTICLES = frozenset("van von der den de del della di da du dos das le la ten ter bin ibn al el y v.".split())
_ORG_AFTER = re.compile(
    r",?[ \t]+(?:Inc|Incorporated|LLC|LLP|Ltd|Limited|GmbH|AG|AB|SA|BV|NV|PLC|Pty|Co|Corp|Corporation)\b")
# a capitalized word right after the name (a sentence's "." may follow it; `Xavier@x.org` is no word)
_TITLE_AFTER = re.compile(r"[ \t]+([A-Z][a-z]+)(?![\w@'-]|\.\w)")
_TODO_CLOSE = re.compile(r"[ \t]*@?\)")
_HANDLE_DIGITS = re.compile(r"([a-z]+)\d{1,4}")


def _name_word_ok(w: str) -> bool:
    """One word of a name: an initial (`L.`, `R`) or a capitalized word of letters, not CamelCase code."""
    if len(w) <= 2 and w[0].isupper() and (len(w) == 1 or w[1] == "."):
        return w not in ("A", "I")  # "A Silly Person": an article, not an initial (initials have dots)
    if "." in w:
        return all(p[:1].isupper() for p in w.split(".") if p) and w.endswith(".") and len(w) <= 6  # "J.R.R."
    low = w.lower()
    if not w[0].isupper() or w == w.upper():
        return False  # lower-case words, and acronyms (IBM, PSF): no lower-case letter
    if low in _NOT_NAME_WORDS or low.endswith(("'s", "\u2019s")):
        return False
    # an upper-case letter inside a part (not after - or ') is CamelCase code unless a name prefix (McDonald)
    if w[1:] != low[1:]:
        for part in _WORD_PARTS.split(w):
            if part[1:] != part[1:].lower() and not _CAMEL_PREFIX.match(part):
                return False
    return True


def _one_name_ok(name: str, min_words: int) -> bool:
    """A person's name: 1-4 name words (particles between them), a suffix, no organization word."""
    words = [w for w in name.split() if w not in _SUFFIX_WORDS]  # "Jane Doe Jr., Bob Roe"
    if not words or words[0] in _PARTICLES or words[-1] in _PARTICLES:
        return False
    core = [w for w in words if w not in _PARTICLES]
    if core[0].lower() in ("a", "an"):
        return False  # "An Example Tool" (as a later word "An" is a name: Nguyễn Văn An)
    if any(w.lower().rstrip(".") in _ORG_WORDS for w in core):
        return False
    if not all(_name_word_ok(w) for w in core) or len(core[-1].rstrip(".")) < 2:
        return False  # a name ends in a full word ("used by Standard C." is not one)
    if max(len(w) for w in core) < 3:
        return False  # "Ax Ay Bx By Cx Cy": two-letter tokens, not names
    return min_words <= len(core) <= 4


def _handle_ok(h: str) -> bool:
    """A user name in `TODO(jdoe)`: lower-case letters (+ trailing digits), not a common tag word."""
    m = _HANDLE_DIGITS.fullmatch(h)
    if m is not None:
        letters = m.group(1)
        return len(letters) >= 4 and letters not in _NOT_HANDLES
    return h.isalpha() and h.islower() and len(h) >= 3 and h not in _NOT_HANDLES


def person_ok(m: re.Match[str], text: str) -> bool:
    """Name-shaped, not an organization, placeholder or identifier; handles only in `TODO(...)`."""
    todo = m.group("todo") is not None
    v, end = m.group("v"), m.end("v")
    if todo and not _TODO_CLOSE.match(text, end):
        return False  # `TODO(fix this)`, `XXX(s, pos)`: not a name in parentheses
    if not v[:1].isupper():
        return todo and _handle_ok(v)
    if _ORG_AFTER.match(text, end):
        return False  # "Jane Doe, Inc."
    after = _TITLE_AFTER.match(text, end)
    if after is not None and after.group(1).lower() not in _NOT_NAME_WORDS:
        return False  # a run of capitalized words longer than a name: a title or product
    if todo and " " not in v and v.lower() in _NOT_HANDLES:
        return False  # `TODO(Fix)`, `TODO(Perf)`: a tag, capitalized
    names = [n for n in _LIST_SPLIT.split(_NAME_SUFFIX.sub("", v)) if n]
    # one word is a name only in `TODO(Jane)`; elsewhere ("Author: Python") it is too often not one
    return all(_one_name_ok(n, 1 if todo and i == 0 else 2) for i, n in enumerate(names))


DETECTORS: tuple[Detector, ...] = (
    # ---- secrets (specific formats first; they win overlaps)
    Detector(
        "private_key", "PRIVATE_KEY", "secret",
        # the body up to its END never crosses another BEGIN: every BEGIN without an END scanned to the end
        # of the text, so a line of 14,000 BEGINs took 40 s and grew with the square (found in review)
        r"-----BEGIN[A-Z ]{0,40}PRIVATE KEY(?: BLOCK)?-----(?:(?:(?!-----BEGIN).)*?-----END[A-Z ]{0,40}PRIVATE KEY(?: BLOCK)?-----"
        r"|(?:\\n|[A-Za-z0-9+/=\s\\\"'])*)"
        # PuTTY's .ppk private block and a .NET `RSAKeyValue` holding the private exponent `<D>` (left open in
        # the last review): the lines after `Private-Lines: N` (also as a JSON string's `\n`), the whole element
        r"|Private-Lines:[ \t]*\d+[ \t]*(?:\r?\n|\\n)(?:[A-Za-z0-9+/=]{4,}[ \t]*(?:\r?\n|\\n|$))+"
        r"|<RSAKeyValue>(?:(?!</?RSAKeyValue>).){0,8000}?<D>[A-Za-z0-9+/=\s]{16,}</D>"
        r"(?:(?!</?RSAKeyValue>).){0,8000}?</RSAKeyValue>",
        r"-----BEGIN[A-Z ]{0,40}PRIVATE KEY|Private-Lines:|<RSAKeyValue>", "<PRIVATE_KEY>", flags=re.DOTALL, priority=100,
        default_policy="drop", multiline=True,
    ),
    Detector(
        "aws_access_key", "AWS_ACCESS_KEY", "secret",
        # no start boundary (the format is distinctive enough): a key glued to a word (`keyAKIA...`, a
        # shell's `export K=...AKIA...` mangled) was kept in clear (found in review)
        r"(?:AKIA|ASIA|ABIA|ACCA|A3T[A-Z0-9])[A-Z0-9]{16}" + _E,
        r"(?:AKIA|ASIA|ABIA|ACCA|A3T[A-Z0-9])[A-Z0-9]{16}", "<AWS_ACCESS_KEY>", priority=90,
    ),
    Detector(
        "aws_secret_key", "AWS_SECRET_KEY", "secret",
        r"(?i:aws)[\w.-]{0,20}(?i:secret|sk)[\w.-]{0,20}[\"']?[ \t]*(?:[:=]|=>)[ \t]*[\"']?(?P<v>[A-Za-z0-9/+]{40})(?![A-Za-z0-9/+=])",
        r"(?i)aws[\w.-]{0,20}(?:secret|sk)", "<SECRET>", priority=85,
    ),
    Detector(
        "github_token", "GITHUB_TOKEN", "secret",
        r"(?:gh[pousr]_[A-Za-z0-9]{36,255}|github_pat_[A-Za-z0-9_]{60,255})" + _E,  # glued too, as AWS keys
        r"gh[pousr]_[A-Za-z0-9]{36}|github_pat_", "<GITHUB_TOKEN>", priority=90,
    ),
    Detector(
        "gitlab_token", "GITLAB_TOKEN", "secret",
        _B + r"gl(?:pat|dt|rt|ptt|cbt|imt|oas|ft|soat|agent)-[A-Za-z0-9_-]{20,}",
        r"gl(?:pat|dt|rt|ptt|cbt|imt|oas|ft|soat|agent)-[A-Za-z0-9_-]{20}", "<GITLAB_TOKEN>", priority=90,
    ),
    Detector(
        "slack_webhook", "SLACK_WEBHOOK", "secret",
        r"https://hooks\.slack\.com/(?:services|workflows|triggers)/[A-Za-z0-9+/_-]{8,}(?:/[A-Za-z0-9+/_-]{6,}){1,2}",
        r"hooks\.slack\.com/", "<SLACK_WEBHOOK>", priority=92,
    ),
    Detector(
        "slack_token", "SLACK_TOKEN", "secret",
        _B + r"(?:xox[abposr]|xapp)-[0-9A-Za-z-]{10,}" + _E,
        r"(?:xox[abposr]|xapp)-[0-9A-Za-z-]{10}", "<SLACK_TOKEN>", priority=90,
    ),
    Detector(
        "anthropic_key", "ANTHROPIC_API_KEY", "secret",
        _B + r"sk-ant-[a-z]{2,10}\d{0,3}-[A-Za-z0-9_-]{32,}",
        r"sk-ant-[a-z]", "<API_KEY>", priority=95,
    ),
    Detector(
        "openai_key", "OPENAI_API_KEY", "secret",
        _B + r"sk-(?:(?:proj|svcacct|admin|None)-[A-Za-z0-9_-]{32,}|[A-Za-z0-9]{20}T3BlbkFJ[A-Za-z0-9]{20}|[A-Za-z0-9]{48})" + _E,
        r"sk-(?:proj-|svcacct-|admin-|None-|[A-Za-z0-9]{20})", "<API_KEY>", priority=90,
    ),
    Detector(
        "google_api_key", "GOOGLE_API_KEY", "secret",
        _B + r"AIza[0-9A-Za-z_-]{35}(?![0-9A-Za-z_-])",
        r"AIza[0-9A-Za-z_-]{35}", "<API_KEY>", priority=90,
    ),
    Detector(
        "stripe_key", "STRIPE_KEY", "secret",
        _B + r"(?:sk|rk)_(?:live|test)_[0-9A-Za-z]{16,247}" + _E + r"|" + _B + r"whsec_[0-9A-Za-z]{24,}" + _E,
        r"(?:sk|rk)_(?:live|test)_[0-9A-Za-z]{16}|whsec_", "<API_KEY>", priority=90,
    ),
    Detector(
        # documented token formats of other providers: SendGrid, npm, PyPI, Hugging Face, Twilio API
        # keys, Shopify, DigitalOcean, Mailgun, Azure storage account keys (the held-out corpus missed
        # every one of them before this detector: 0/4 each)
        "provider_token", "API_KEY", "secret",
        _B + r"(?:SG\.[A-Za-z0-9_-]{22}\.[A-Za-z0-9_-]{43}|npm_[A-Za-z0-9]{36}|pypi-AgEIcHlwaS5vcmc[A-Za-z0-9_-]{50,}"
        r"|hf_[A-Za-z0-9]{34}|SK[0-9a-fA-F]{32}|shp(?:at|ca|pa|ss)_[0-9a-fA-F]{32}|do[opr]_v1_[0-9a-f]{64}"
        r"|key-[0-9a-z]{32})" + _E
        + r"|(?<=AccountKey=)[A-Za-z0-9+/]{86}=="
        # found in review (published formats): Google OAuth client secrets, Grafana service accounts, New
        # Relic user keys, Postman, Linear, Sentry user tokens, HashiCorp Vault service tokens, Atlassian
        # API tokens, Slack refresh tokens, age secret keys, Databricks, Doppler
        + r"|" + _B + r"(?:GOCSPX-[A-Za-z0-9_-]{28}|glsa_[A-Za-z0-9]{32}_[0-9a-fA-F]{8}|NRAK-[A-Z0-9]{27}"
        r"|PMAK-[0-9a-f]{24}-[0-9a-f]{34}|lin_api_[A-Za-z0-9]{40}|sntryu_[0-9a-f]{64}|hvs\.[A-Za-z0-9_-]{90,}"
        r"|ATATT3[A-Za-z0-9_=-]{180,}|xoxe-1-[A-Za-z0-9-]{140,}|AGE-SECRET-KEY-1[0-9A-Z]{58}|dapi[0-9a-f]{32}(?:-\d)?"
        r"|dp\.pt\.[A-Za-z0-9]{43})" + _E
        # left open in the last review, published formats: Telegram bot tokens (the bot's id, then 35
        # characters from "AA"), Discord bot tokens (the base64 of the bot's numeric id, which starts
        # M/N/O, a 6-character timestamp, an HMAC), Azure AD (Entra) client secrets ("<3>digitQ~...")
        + r"|" + _B + r"\d{8,10}:AA[A-Za-z0-9_-]{31,33}(?![A-Za-z0-9_-])"
        # (the id part holds a digit, as base64 of digits does, so a dotted CamelCase name never matches)
        + r"|" + _B + r"[MNO](?=[A-Za-z]{0,24}\d)[A-Za-z0-9]{23,25}\.[A-Za-z0-9_-]{6}\.[A-Za-z0-9_-]{27,38}(?![A-Za-z0-9_-])"
        + r"|(?<![A-Za-z0-9_~.])[A-Za-z0-9_~.]{3}\dQ~[A-Za-z0-9_~.-]{31,34}(?![A-Za-z0-9_~.-])",
        r"SG\.[A-Za-z0-9_-]{22}\.|npm_[A-Za-z0-9]{36}|pypi-AgEIcHlwaS5vcmc|hf_[A-Za-z0-9]{34}|SK[0-9a-fA-F]{32}"
        r"|shp(?:at|ca|pa|ss)_|do[opr]_v1_|key-[0-9a-z]{32}|AccountKey=|GOCSPX-|glsa_|NRAK-|PMAK-|lin_api_|sntryu_"
        r"|hvs\.|ATATT3|xoxe-1-|AGE-SECRET-KEY-1|dapi[0-9a-f]{32}|dp\.pt\.|\d{8}:AA|[MNO][A-Za-z0-9]{23}|\dQ~",
        "<API_KEY>", priority=88,
    ),
    Detector(
        "jwt", "JWT", "secret",
        _B + r"eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.(?:[A-Za-z0-9_]|-(?!----))*",
        r"eyJ[A-Za-z0-9_-]{8,}\.eyJ", "<JWT>", priority=88,
    ),
    Detector(
        "url_credentials", "URL_CREDENTIALS", "secret",
        r"\b[A-Za-z][A-Za-z0-9+.-]{1,15}://(?P<v>[^\s:/@'\"<>]{1,64}:[^\s/@'\"<>]{1,128})@[A-Za-z0-9.\[\]-]",
        r"://[^\s:/@'\"]{1,64}:[^\s/@'\"]{1,128}@", "<CREDENTIALS>", validate=url_creds_ok, priority=80,
    ),
    Detector(
        "secret_assignment", "SECRET_ASSIGNMENT", "secret",
        # starts at the keyword (a `DB_`/`self.` prefix does not change the value found, and a
        # leading `[\w.-]*` made Python retry every position of every word)
        # the keywords as a trie in Python (shared prefixes fail fast); flat in the prefilter (Rust and
        # hyperscan turn a flat literal set into a SIMD multi-literal search)
        # a key and a value may be quoted with escaped quotes too (`\"password\": \"...\"`: JSON inside a
        # string, as an agent's tool call writes a config file; found in review)
        r"(?P<k>(?:" + _trie_regex(_SECRET_KEYWORDS.split("|")) + "|" + _SHORT_SECRET_KEYWORDS + ")" + _SECRET_KEY_SUFFIX + ")"
        r"\\?[\"']?[ \t]*(?:(?<![=!<>]):?=(?!=)|=>|:)[ \t]*(?:[rbuRBU]{0,2}\\?(?P<q>[\"'`])(?P<v>[^\"'`\n]{4,200}?)\\?(?P=q)"
        # an unquoted value runs to the end of the line or to a comment, which (as in .env files and
        # shells) is a `#` after whitespace: found in review, `SECRET_KEY=django-insecure-k8#n2x!v...`
        # kept everything after its `#`. Parentheses may appear inside it, not at its end (a call:
        # `password=getpass()` is code, not a secret)
        r"|(?P<v2>(?<=[=:])[^\s\"'`#,;(){}\[\]][^\s\"'`,;{}\[\]]{5,199}(?<!\))"
        r"|(?<=[=:] )[^\s\"'`#,;(){}\[\]][^\s\"'`,;{}\[\]]{5,199}(?<!\)))(?=(?:[ \t]+#.*)?[ \t]*$))",
        r"(?:" + _SECRET_KEYWORDS + r"|pass|Pass|PASS|pw|Pw|PW)[\w-]{0,12}\\?[\"']?[ \t]*(?:=|:)",  # `secret-key:` too
        "<SECRET>", validate=assignment_ok, flags=re.MULTILINE, priority=60,
    ),
    # credentials as parameters, headers and command-line options: found in a privacy review to pass
    # every rule above (a URL's `?access_token=`, JDBC's `&password=`, libpq's `password=` in a
    # conninfo string, `Authorization: Basic ...`, `curl -u user:pass`, `mysql -pSECRET`, an upper-case
    # environment prefix of a command: `PGPASSWORD=... psql`)
    Detector(
        "credential_param", "CREDENTIALS", "secret",
        r"(?:[?&;]|(?<=[\s\"']))(?i:access_token|auth_token|api[_-]?key|client_secret|password|passwd|pwd|secret|token)"
        # a value may hold `#` (found in review: `Password=kX9#mQ2!...;` kept its value, cut at the `#` to
        # fewer than 6 characters); it ends at `&`, `;`, whitespace or a quote
        r"=(?P<v>[^&\s\"'<>;(),\[\]]{6,200}+)(?![(),\[\]])",
        r"(?i)(?:access_token|auth_token|api_key|api-key|apikey|client_secret|password|passwd|pwd|secret|token)=[^&\s]",
        "<SECRET>", validate=credential_param_ok, priority=58,
    ),
    Detector(
        "auth_header", "AUTH_HEADER", "secret",
        # any case (found in review: `authorization: basic ...` was kept)
        r"(?<![\w-])(?i:Basic|Bearer|Token|Negotiate)[ \t]+(?P<v>[A-Za-z0-9+/._~-]{16,}=*)(?![\w+/=-])",
        r"(?i:Basic|Bearer|Token|Negotiate)[ \t]+[A-Za-z0-9+/._~-]{16}", "<SECRET>",
        validate=auth_header_ok, priority=57,
    ),
    Detector(
        "cli_password", "CLI_PASSWORD", "secret",
        r"(?<=[ \t])(?:-u|--user)[ \t]+[\"']?(?P<v>[^\s:\"'$]+:[^\s\"']{4,})"
        r"|(?<=[ \t])-p(?P<v2>[^\s\"'$-][^\s\"']{3,})"
        # an environment prefix or option: followed by anything on the line (found in review: `-e
        # POSTGRES_PASSWORD=... -d postgres`, `PGPASSWORD=... ./migrate.sh` were kept)
        r"|(?<![\w$])[A-Z][A-Z0-9_]*(?:PASSWORD|PASSWD|SECRET|TOKEN|API_KEY)=(?P<v3>[^\s\"'$`]{6,200})(?=[ \t]+\S)"
        # `--password=X`/`--password X` of any tool; `-p X` after `sshpass` or `docker login`, `-a X` after
        # `redis-cli` (found in review: `mysql --password=...`, `sshpass -p '...'`, `docker login -u d -p ...`)
        r"|(?<=[ \t])(?:--(?:password|passwd)(?:=|[ \t]+)|-p[ \t]+|-a[ \t]+)[\"']?(?P<v4>[^\s\"'$<{-][^\s\"']{3,199})",
        r"curl(?:[^\n]|\\\r?\n)*(?:-u|--user)[ \t]|mysql(?:[^\n]|\\\r?\n)*[ \t]-p[^\s]"
        r"|(?:PASSWORD|PASSWD|SECRET|TOKEN|API_KEY)=[^\s]"
        r"|--password|--passwd|sshpass|docker login|redis-cli",
        "<SECRET>", validate=cli_password_ok, priority=58,
    ),
    Detector(
        "high_entropy", "HIGH_ENTROPY_SECRET", "secret",
        r"(?P<k>(?<![\w])[A-Za-z_][\w.-]{0,60})[\"']?[ \t]*(?:(?<![=!<>]):?=(?!=)|:)[ \t]*[rbuRBU]{0,2}(?P<q>[\"'`])"
        r"(?P<v>[A-Za-z0-9+/=_.-]{20,100})(?P=q)",
        r"[=:][ \t]*[rbuRBU]{0,2}[\"'`][A-Za-z0-9+/=_.-]{20,100}[\"'`]", "<SECRET>", validate=high_entropy_ok,
        priority=40, hit_filter=high_entropy_hit,
    ),
    # ---- personal data
    Detector(
        "email", "EMAIL_ADDRESS", "pii",
        # the local part may hold Latin, Greek and Cyrillic letters (`josé@`, `jörg.müller@`: found in a
        # privacy review, the first was kept whole and the second as `jö<EMAIL>`); the domain is ASCII
        # (an IDN domain as its punycode `xn--` form; written in Unicode it is a known miss, docs/pii.md)
        # `git@github.com:acme/app.git` is an SSH remote's service user, not a person's address (found in
        # review: remotes, `pip install git+ssh://git@...` became `<EMAIL>:acme/app.git`)
        rf"(?<![\w{_LOCAL_LETTERS}.+%-])(?!git@)[A-Za-z0-9{_LOCAL_LETTERS}][A-Za-z0-9{_LOCAL_LETTERS}._%+-]{{0,63}}"
        r"@(?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.)+"
        r"(?!(?:png|jpe?g|gif|svg|webp|ico|css|js|ts|map|json|min|txt)\b)[A-Za-z]{2,24}(?![\w-])",
        # the domain's labels, then the TLD's first letters: `a@mail.t-online.de`, `b@students.42.fr` too
        r"[^ \t\r\n@]@(?:[A-Za-z0-9-]+\.)+[A-Za-z]{2}", "<EMAIL>", priority=70,
    ),
    Detector(
        "home_dir_user", "HOME_DIR_USER", "pii",
        # `/mnt/c/Users/` (WSL), `/var/home/`, `/export/home/` too (found in review)
        r"(?:(?<![\w.])/Users/|(?<![\w.])/home/|(?<=/mnt/[a-z])/Users/|(?<=/var)/home/|(?<=/export)/home/|(?<![A-Za-z])[A-Za-z]:(?:\\\\|\\|/)(?i:Users|Documents and Settings)(?:\\\\|\\|/))"
        r"(?P<v>[A-Za-z0-9][A-Za-z0-9._-]{0,63})(?=[\\/\s\"'`:;,)\]]|$)",
        r"/Users/[A-Za-z0-9]|/home/[A-Za-z0-9]|(?i):(?:\\\\|\\|/)(?:Users|Documents and Settings)(?:\\\\|\\|/)",
        "<USER>", validate=user_ok, priority=65,
    ),
    Detector(
        "ipv4", "IP_ADDRESS", "pii",
        r"(?<![\w.])(?:(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)\.){3}(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)(?!\w|\.\w)",
        r"\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3}", "<IP_ADDRESS>", validate=ipv4_ok, priority=55,
    ),
    Detector(
        "ipv6", "IP_ADDRESS", "pii",
        r"(?<![\w:.])(?:(?:[0-9A-Fa-f]{1,4}:){7}[0-9A-Fa-f]{1,4}"
        r"|(?:[0-9A-Fa-f]{1,4}:){1,7}:(?:[0-9A-Fa-f]{1,4}(?::[0-9A-Fa-f]{1,4}){0,6})?"
        r"|:(?::[0-9A-Fa-f]{1,4}){1,7})(?![\w:])",
        # starts with a literal ':' so Rust can memchr to candidates (10x faster than a hex class first);
        # every address the validator accepts (>= 3 groups) contains ":h:h" or "::h"
        r":(?:[0-9A-Fa-f]{1,4})?:[0-9A-Fa-f]{1,4}", "<IP_ADDRESS>", validate=ipv6_ok,
        priority=55,
    ),
    Detector(
        "credit_card", "CREDIT_CARD", "pii",
        r"(?<![\w.-])(?:\d{4}(?P<s>[ -]?)\d{4}(?P=s)\d{4}(?P=s)\d{1,7}(?:(?P=s)\d{3})?|\d{4}(?P<t>[ -]?)\d{6}(?P=t)\d{4,5})"
        r"(?![\w-]|\.\w)",  # a sentence-final "." is not part of a number ("my card is 4111 1111 1111 1111.")
        r"\d{4}[ -]?\d{4}[ -]?\d{4}[ -]?\d|\d{4}[ -]?\d{6}[ -]?\d{4}", "<CREDIT_CARD>", validate=card_ok,
        priority=75,
    ),
    Detector(
        "iban", "IBAN_CODE", "pii",
        r"(?<![A-Za-z0-9])[A-Z]{2} ?\d{2}(?:[ -]?[A-Z0-9]{4}){2,7}(?:[ -]?[A-Z0-9]{1,3})?(?![A-Za-z0-9])",
        # the country codes as a literal set (the validator accepts only these), so Rust can use
        # its multi-literal search instead of a DFA over every position
        r"(?:" + "|".join(sorted(IBAN_LENGTHS)) + r") ?\d{2}[ -]?[A-Z0-9]{4}[ -]?[A-Z0-9]{4}", "<IBAN>",
        validate=iban_match_ok, priority=76,
    ),
    Detector(
        "us_ssn", "US_SSN", "pii",
        r"(?<![\w-])\d{3}-\d{2}-\d{4}(?![\w-])",
        r"\d{3}-\d{2}-\d{4}", "<SSN>", validate=ssn_ok, priority=74,
    ),
    Detector(
        "phone", "PHONE_NUMBER", "pii",
        r"(?<![\w.+-])(?:\+\d{1,3}[ .-]?(?:\(\d{1,4}\)[ .-]?)?\d{1,4}(?:[ .-]\d{2,8}){1,4}"
        r"|\+[1-9]\d{9,14}"  # E.164 as written by APIs and forms: +14155552671
        r"|\(\d{3}\)[ .-]?\d{3}[ .-]\d{4}|\d{3}([.-])\d{3}\1\d{4}|\d{3} \d{3} \d{4})(?![\w-]|\.\w)",
        r"\+\d{1,3}[ .-]?\(?\d|\(\d{3}\)[ .-]?\d{3}[ .-]\d{4}|\d{3}[ .-]\d{3}[ .-]\d{4}", "<PHONE>",
        validate=phone_ok, priority=50,
    ),
    Detector(
        # names in code contexts (author lines, copyright holders, git trailers, TODO(name));
        # the same entity as NER's names in chat turns, so both count as `pii.person`
        "person", "PERSON", "pii", _PERSON_PATTERN, _PERSON_PREFILTER, "<PERSON>", validate=person_ok,
        priority=30, score=0.6,
    ),
)

BY_ENTITY: dict[str, Detector] = {d.entity: d for d in DETECTORS}
ENTITIES: tuple[str, ...] = tuple(BY_ENTITY)
