"""What output from the sandbox may reach the user's browser, and how much of it.

Every bundle the sandbox sends passes through here on its way to the frontend:
display data, execute results, display updates, ``page`` and ``set_next_input``
payloads, user expressions, and inspect and complete replies (see
docs/security-output.md).

**Active content.** JupyterLab runs scripts in the output of a live kernel: an
``application/javascript`` output, ``<script>`` and ``on*=`` handlers in HTML
and in markdown's raw HTML. Such a script runs with the user's Jupyter token and
can use the Jupyter REST API (write files, open a terminal): an escape from the
sandbox. Unless the output is trusted (``OutputPolicy(trusted=True)``, the
``output_policy`` setting), only known MIME types are kept; HTML, SVG and
markdown's HTML are cleaned with nh3 (the ammonia sanitizer), keeping tables,
styles, images and links; a ``set_next_input`` payload may add a cell below but
never replace the user's cell. What was removed is said once per kernel.

**Size.** ``OutputBudget`` enforces ``output_limit_mb`` per cell in the kernel
too, on stream text and display data, since code in the sandbox can bypass the
runtime's own limit.

The functions are pure; ``OutputPolicy`` only remembers what to say once.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from dataclasses import dataclass, field
from html import escape, unescape
from typing import Any, Generic, TypeVar

import nh3

from .protocol import Completion, Inspection, size_of
from .runtime.calls import limit_text

# -- MIME types ----------------------------------------------------------------------

# What JupyterLab renders without running code. Anything else (application/javascript,
# widget views, plotly, vega, bokeh ... whose renderers run code from the output) is dropped.
SAFE_MIME_TYPES = frozenset(
    {
        "text/plain",
        "text/html",
        "text/markdown",
        "text/latex",  # MathJax in JupyterLab runs with its "safe" extension (no javascript: links)
        "image/png",
        "image/jpeg",
        "image/gif",
        "image/webp",
        "image/bmp",
        "image/svg+xml",
        "application/json",
    }
)
PLACEHOLDER = "[output removed by daytona-kernel: {types}]"
MAX_DISPLAY_IDS = 10_000  # display ids remembered for updates (DisplayIds)

# -- the HTML allow-list (nh3 / ammonia) ---------------------------------------------


def _names(words: str) -> frozenset[str]:
    return frozenset(words.split())


SVG_TAGS = _names(
    "svg g defs symbol use title desc metadata style path rect circle ellipse line polyline polygon "
    "text tspan textPath image switch clipPath mask pattern marker linearGradient radialGradient stop "
    "filter feBlend feColorMatrix feComponentTransfer feComposite feConvolveMatrix feDiffuseLighting "
    "feDisplacementMap feDistantLight feDropShadow feFlood feFuncA feFuncB feFuncG feFuncR "
    "feGaussianBlur feMerge feMergeNode feMorphology feOffset fePointLight feSpecularLighting "
    "feSpotLight feTile feTurbulence"
)  # no script, foreignObject, animate/set (they can set an href), feImage (loads a URL)
SVG_ATTRIBUTES = _names(
    "xmlns version viewBox preserveAspectRatio x y x1 x2 y1 y2 cx cy r rx ry fx fy d points "
    "pathLength transform width height href xlink:href fill fill-opacity fill-rule stroke "
    "stroke-width stroke-opacity stroke-linecap stroke-linejoin stroke-dasharray stroke-dashoffset "
    "stroke-miterlimit opacity color display visibility clip-path clip-rule clipPathUnits mask "
    "maskUnits maskContentUnits filter filterUnits primitiveUnits marker-start marker-mid marker-end "
    "markerWidth markerHeight markerUnits orient refX refY patternUnits patternContentUnits "
    "patternTransform gradientUnits gradientTransform spreadMethod offset stop-color stop-opacity "
    "font-family font-size font-style font-weight text-anchor dominant-baseline alignment-baseline "
    "baseline-shift letter-spacing word-spacing text-decoration dx dy rotate textLength lengthAdjust "
    "startOffset in in2 result mode operator k1 k2 k3 k4 stdDeviation values type tableValues slope "
    "intercept amplitude exponent flood-color flood-opacity lighting-color scale xChannelSelector "
    "yChannelSelector radius baseFrequency numOctaves seed stitchTiles kernelMatrix order divisor "
    "bias targetX targetY edgeMode surfaceScale specularConstant specularExponent diffuseConstant "
    "azimuth elevation pointsAtX pointsAtY pointsAtZ limitingConeAngle z vector-effect "
    "shape-rendering image-rendering text-rendering mix-blend-mode"
)
HTML_TAGS = frozenset(nh3.ALLOWED_TAGS | {"style", "font", "input", "label", "section", "main", "tfoot"})
# Everything may carry class, id and style (DataFrames, pandas Styler and xarray need them). Never
# data-* attributes: JupyterLab runs a command when an element with data-commandlinker-command is clicked.
COMMON_ATTRIBUTES = frozenset({"class", "id", "style", "title", "lang", "dir", "role", "align", "valign"})
EXTRA_ATTRIBUTES = {
    "table": {"border", "cellpadding", "cellspacing", "width", "bgcolor"},
    "td": {"width", "height", "bgcolor", "nowrap"},
    "th": {"width", "height", "bgcolor", "nowrap"},
    "tr": {"bgcolor"},
    "style": {"scoped", "type", "media"},
    "font": {"color", "face", "size"},
    "img": {"loading"},
    "input": {"checked", "disabled"},  # xarray's collapsible sections; type is limited below
    "label": {"for"},
    "details": {"open"},
    "ol": {"type", "reversed"},
    "li": {"value"},
}
URL_SCHEMES = frozenset({"http", "https", "mailto", "data"})  # data: only on images, see _attribute
INPUT_TYPES = frozenset({"checkbox", "radio"})
XLINK_NS = "http://www.w3.org/1999/xlink"


def _attributes() -> dict[str, set[str]]:
    attributes: dict[str, set[str]] = {tag: set(names) for tag, names in nh3.ALLOWED_ATTRIBUTES.items()}
    for tag, names in EXTRA_ATTRIBUTES.items():
        attributes.setdefault(tag, set()).update(names)
    for tag in SVG_TAGS:
        attributes.setdefault(tag, set()).update(SVG_ATTRIBUTES)
    attributes["*"] = set(COMMON_ATTRIBUTES)
    return attributes


def _attribute(tag: str, name: str, value: str) -> str | None:
    """data: URLs are images, never links (a data: link can be an HTML page)."""
    if value.lstrip().lower().startswith("data:") and not (tag in ("img", "image") and name in ("src", "href", "xlink:href")):
        return None
    return value


_CLEANER = nh3.Cleaner(
    tags=set(HTML_TAGS | SVG_TAGS),
    clean_content_tags={"script"},  # dropped with their content; other unknown tags keep their text
    attributes=_attributes(),
    attribute_filter=_attribute,
    url_schemes=set(URL_SCHEMES),
    tag_attribute_values={"input": {"type": set(INPUT_TYPES)}},
    set_tag_attribute_values={"svg": {"xmlns:xlink": XLINK_NS}},
    strip_comments=True,
)

# What counts as active content, for the notice only (nh3 does the removing, whatever the notice says).
ACTIVE_HTML = re.compile(
    r"<\s*(script|iframe|object|embed|frame|base|meta|link|form|foreignobject|animate|set|template|noscript)\b"
    r"|<[^<>]*[\s\"'/]on[a-z]+\s*="  # a handler inside a tag, not " one =" in text
    r"|javascript\s*:|data-commandlinker",
    re.IGNORECASE,
)
# A "<" that can start markup in HTML or in markdown's raw HTML.
TAG_START = re.compile(r"<[A-Za-z!/?]")
# A javascript: / vbscript: URL in markdown, also with whitespace, control characters or
# backslash escapes between the letters (browsers and markdown both drop those).
SCRIPT_URL = re.compile(
    "|".join(r"[\s\\\x00-\x1f]*".join(word) + r"[\s\\\x00-\x1f]*:" for word in ("javascript", "vbscript")),
    re.IGNORECASE,
)
BLOCKED_URL = "blocked:"
AUTOLINK = re.compile(r"<((?:https?|mailto):[^\s<>()\[\]]+)>", re.IGNORECASE)
FENCE = re.compile(r"[ \t]{0,3}(`{3,}|~{3,})")
BACKTICKS = re.compile(r"`+")


def sanitize_html(html: str) -> str:
    """HTML without scripts, event handlers, javascript: URLs, frames, forms or command links."""
    return _CLEANER.clean(html)


def sanitize_svg(svg: str) -> str:
    """An SVG document cleaned like HTML, still well-formed XML (JupyterLab shows it as an <img>)."""
    cleaned = _CLEANER.clean(svg).replace("&nbsp;", "&#160;")
    return cleaned.strip()


def sanitize_markdown(markdown: str) -> str:
    """Markdown with its raw HTML cleaned and no javascript: links. Code spans and fenced
    blocks stay as they are, unless they hold something that could be taken for markup:
    then they become the same <code> / <pre><code> element, written here with the text escaped.

    Where this reading of the markdown differs from the frontend's, only fidelity suffers: every
    piece that holds a '<' that could open a tag is cleaned or escaped, code or not."""
    if not TAG_START.search(markdown) and not SCRIPT_URL.search(unescape(markdown)):
        return markdown
    return "".join(_markdown_text(text) if kind == "text" else _markdown_code(kind, text) for kind, text in _pieces(markdown))


def _pieces(markdown: str) -> list[tuple[str, str]]:
    """Markdown split into ("text" | "fence" | "span", text) pieces, in order, in linear time."""
    pieces: list[tuple[str, str]] = []
    lines = markdown.splitlines(keepends=True)
    text: list[str] = []
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if opening is None:
            text.append(lines[i])
            i += 1
            continue
        end = i + 1
        while end < len(lines) and not _closes(lines[end], opening.group(1)):
            end += 1
        pieces += _spans("".join(text))
        pieces.append(("fence", "".join(lines[i : end + 1])))
        text = []
        i = end + 1
    return pieces + _spans("".join(text))


def _closes(line: str, fence: str) -> bool:
    body = line.rstrip()
    stripped = body.lstrip(" \t")
    return len(body) - len(stripped) <= 3 and len(stripped) >= len(fence) and stripped == fence[0] * len(stripped)


def _spans(text: str) -> list[tuple[str, str]]:
    """Inline code spans: a run of backticks up to the next run of the same length."""
    runs = [(m.start(), m.end()) for m in BACKTICKS.finditer(text)]
    following: list[int | None] = [None] * len(runs)
    last: dict[int, int] = {}
    for k in range(len(runs) - 1, -1, -1):
        length = runs[k][1] - runs[k][0]
        following[k], last[length] = last.get(length), k
    pieces: list[tuple[str, str]] = []
    pos = k = 0
    while k < len(runs):
        start, close = runs[k][0], following[k]
        if close is None or text[start - 1 : start] == "\\":  # no closing run, or an escaped backtick
            k += 1
            continue
        pieces += [("text", text[pos:start]), ("span", text[start : runs[close][1]])]
        pos, k = runs[close][1], close + 1
    pieces.append(("text", text[pos:]))
    return [piece for piece in pieces if piece[1]]


def _markdown_text(text: str) -> str:
    """Markdown outside code: left alone when nothing in it can become markup or a script link,
    otherwise cleaned as HTML (a '>' that starts a quote stays a '>': it cannot open a tag)."""
    if not TAG_START.search(text) and not SCRIPT_URL.search(unescape(text)):
        return text
    text = AUTOLINK.sub(r"[\1](\1)", text)  # <https://...> would otherwise be taken for a tag
    cleaned = sanitize_html(text).replace("&gt;", ">")
    return SCRIPT_URL.sub(BLOCKED_URL, cleaned)


def _markdown_code(kind: str, code: str) -> str:
    if not TAG_START.search(code) and not SCRIPT_URL.search(unescape(code)):
        return code
    if kind == "fence":
        lines = code.splitlines()
        fence = FENCE.match(lines[0])
        assert fence is not None
        language = lines[0][fence.end() :].strip().split(" ")[0]
        if len(lines) > 1 and _closes(lines[-1], fence.group(1)):
            lines.pop()
        css = f' class="language-{escape(language)}"' if language else ""
        return f"<pre><code{css}>{escape(chr(10).join(lines[1:]))}\n</code></pre>\n"
    ticks = len(code) - len(code.lstrip("`"))
    inner = code[ticks:-ticks]
    if inner.startswith(" ") and inner.endswith(" ") and inner.strip():
        inner = inner[1:-1]
    return f"<code>{escape(inner)}</code>"


# -- bundles -------------------------------------------------------------------------


# what a cleaned value is: a message's content or a reply, or a payload item (None when it is dropped)
V = TypeVar("V", dict[str, Any], "dict[str, Any] | None")


@dataclass
class Cleaned(Generic[V]):
    """A cleaned value and what was removed from it, by MIME type (for the notice)."""

    value: V
    removed: set[str] = field(default_factory=set)


def clean_bundle(data: dict[str, Any], trusted: bool) -> Cleaned[dict[str, Any]]:
    """A MIME bundle fit to show: values of the right type, and (unless ``trusted``) only safe
    types, with HTML, SVG and markdown cleaned. A bundle left empty gets a text/plain placeholder."""
    out: dict[str, Any] = {}
    removed: set[str] = set()
    for mime, value in data.items():
        if not _well_typed(mime, value, trusted):
            removed.add(f"{str(mime)[:60]} (malformed)")
            continue
        if trusted:
            out[mime] = value
        elif mime not in SAFE_MIME_TYPES:
            removed.add(mime)
        elif mime == "text/html":
            out[mime] = _noting(sanitize_html, value, mime, removed)
        elif mime == "image/svg+xml":
            out[mime] = _noting(sanitize_svg, value, mime, removed)
        elif mime == "text/markdown":
            out[mime] = _noting(sanitize_markdown, value, mime, removed)
        else:
            out[mime] = value
    if not out and data:
        out["text/plain"] = PLACEHOLDER.format(types=", ".join(sorted(removed)))
    return Cleaned(out, removed)


def _well_typed(mime: Any, value: Any, trusted: bool) -> bool:
    """text/plain is always a string (the kernel keeps it for history); when not ``trusted``,
    every type but JSON is. A trusted bundle may hold anything else, as with ipykernel."""
    if not isinstance(mime, str):
        return False
    if mime == "text/plain" or not (trusted or mime == "application/json" or mime.endswith("+json")):
        return isinstance(value, str)
    return True


def _noting(clean: Any, value: str, mime: str, removed: set[str]) -> str:
    if ACTIVE_HTML.search(value) or (mime == "text/markdown" and SCRIPT_URL.search(unescape(value))):
        removed.add(f"scripts in {mime}")
    return str(clean(value))


def clean_content(msg_type: str, content: dict[str, Any], trusted: bool) -> Cleaned[dict[str, Any]]:
    """The content of a display_data, update_display_data or execute_result output with its bundle cleaned."""
    if msg_type not in ("display_data", "update_display_data", "execute_result") or not isinstance(content.get("data"), dict):
        return Cleaned(content)
    bundle = clean_bundle(content["data"], trusted)
    return Cleaned(dict(content, data=bundle.value), bundle.removed)


def clean_payload(item: dict[str, Any], trusted: bool) -> Cleaned[dict[str, Any] | None]:
    """An execute_reply payload item, or None (as ``value``) when it must not reach the frontend.

    ``page`` is cleaned like display data. ``set_next_input`` may add a cell below the user's
    cell, but never replace it: ``replace`` is turned off (ipykernel only sets it for ``%load``,
    whose code then lands in a new cell). Unknown sources are dropped."""
    source = item.get("source")
    if trusted:
        return Cleaned(item)
    if source == "page" and isinstance(item.get("data"), dict):
        bundle = clean_bundle(item["data"], trusted)
        return Cleaned(dict(item, data=bundle.value), bundle.removed)
    if source == "set_next_input" and isinstance(item.get("text"), str):
        removed = {"set_next_input replacing your cell"} if item.get("replace") else set()
        return Cleaned({"source": source, "text": item["text"], "replace": False}, removed)
    if source == "ask_exit":
        return Cleaned({"source": source, "keepkernel": bool(item.get("keepkernel", False))})
    return Cleaned(None, {f"payload {str(source)[:40]!r}"})


def clean_reply(reply: Inspection | Completion, trusted: bool) -> Cleaned[dict[str, Any]]:
    """An inspect or complete reply from the runtime (parsed in ``protocol.py``) as the reply's fields,
    an inspection's bundle cleaned."""
    if isinstance(reply, Inspection):
        bundle = clean_bundle(reply.data, trusted)
        return Cleaned({"found": reply.found, "data": bundle.value, "metadata": reply.metadata}, bundle.removed)
    completion: dict[str, Any] = {"matches": reply.matches}
    for key, value in (("cursor_start", reply.cursor_start), ("cursor_end", reply.cursor_end), ("metadata", reply.metadata)):
        if value is not None:
            completion[key] = value
    return Cleaned(completion)


def clean_user_expressions(values: dict[str, Any], trusted: bool) -> Cleaned[dict[str, Any]]:
    """execute_reply's user_expressions: each result's bundle cleaned like display data."""
    out: dict[str, Any] = {}
    removed: set[str] = set()
    for name, result in values.items():
        if isinstance(result, dict) and isinstance(result.get("data"), dict):
            bundle = clean_bundle(result["data"], trusted)
            removed |= bundle.removed
            result = dict(result, data=bundle.value)
        out[name] = result
    return Cleaned(out, removed)


class OutputPolicy:
    """One kernel's output policy: cleans what the sandbox sends, and says once what it removed."""

    NOTICE = (
        "daytona-kernel removed active content from the sandbox's output ({what}). Output from a "
        "sandbox is shown without scripts, because a script in an output runs in your browser with "
        "your Jupyter token. If you trust this sandbox, set DaytonaKernel.output_policy = 'trusted' "
        "(or DAYTONA_KERNEL_OUTPUT_POLICY=trusted) and restart the kernel. "
        "See docs/security-output.md. This notice is shown once per kernel.\n"
    )

    def __init__(self, trusted: bool) -> None:
        self.trusted = trusted
        self.displays = DisplayIds()
        self._removed: set[str] = set()
        self._noticed = False

    def content(self, msg_type: str, content: dict[str, Any]) -> dict[str, Any]:
        return self._keep(clean_content(msg_type, content, self.trusted))

    def payload(self, item: dict[str, Any]) -> dict[str, Any] | None:
        return self._keep(clean_payload(item, self.trusted))

    def reply(self, reply: Inspection | Completion | None) -> dict[str, Any] | None:
        return None if reply is None else self._keep(clean_reply(reply, self.trusted))

    def user_expressions(self, values: dict[str, Any]) -> dict[str, Any]:
        return self._keep(clean_user_expressions(values, self.trusted))

    def take_notice(self) -> str | None:
        """The notice, the first time something was removed; None before and after."""
        if self._noticed or not self._removed:
            return None
        self._noticed = True
        return self.NOTICE.format(what="; ".join(sorted(self._removed)))

    def _keep(self, cleaned: Cleaned[V]) -> V:
        self._removed |= cleaned.removed
        return cleaned.value


class DisplayIds:
    """The display ids this kernel showed (a display_data with a ``transient.display_id``), newest kept:
    an update for any other id has nothing to update in the page, so it is dropped, however many come."""

    def __init__(self, limit: int = MAX_DISPLAY_IDS) -> None:
        self._ids: OrderedDict[str, None] = OrderedDict()
        self._limit = limit

    def shown(self, msg_type: str, content: dict[str, Any]) -> bool:
        """Note a shown display's id; whether an update names a display that was shown."""
        transient = content.get("transient")
        display_id = transient.get("display_id") if isinstance(transient, dict) else None
        if msg_type == "update_display_data":
            return isinstance(display_id, str) and display_id in self._ids
        if isinstance(display_id, str) and msg_type in ("display_data", "execute_result"):
            self._ids[display_id] = None
            self._ids.move_to_end(display_id)
            if len(self._ids) > self._limit:
                self._ids.popitem(last=False)
        return True


# -- size ------------------------------------------------------------------------------

NOTICE_SLACK_CHARS = 4096  # room for the runtime's own limit notice, so a well-behaved sandbox never trips ours
# Each message costs at least this many characters, about its envelope on the wire (header, parent header,
# metadata): a flood of tiny displays, clears or widget updates stops at the budget too.
MESSAGE_FLOOR_CHARS = 256


class OutputBudget:
    """The output one cell may send, counted in the kernel: stream text is cut at the limit,
    a display that does not fit is dropped. ``limit_chars`` 0 means no limit."""

    NOTICE = (
        "\ndaytona-kernel: this cell's output passed the limit of {limit}; {dropped} more were dropped "
        "in the kernel. Raise DaytonaKernel.output_limit_mb to see more.\n"
    )

    def __init__(self, limit_chars: int) -> None:
        self.limit = limit_chars + NOTICE_SLACK_CHARS if limit_chars > 0 else 0
        self._limit_text = limit_text(limit_chars)
        self.used = 0
        self.dropped = 0
        self._noticed = False

    def text(self, text: str) -> str:
        """The part of ``text`` that fits."""
        if not self.limit:
            return text
        room = max(0, self.limit - self.used)
        if len(text) > room:
            self.dropped += len(text) - room
            text = text[:room]
        self.used += len(text)
        return text

    def fits(self, content: dict[str, Any]) -> bool:
        """Whether a display, update, result or clear fits; counts it if so."""
        return self.fits_size(size_of(content.get("data")) if "data" in content else 0)

    def fits_size(self, size: int) -> bool:
        """Whether a message of ``size`` characters fits (at least ``MESSAGE_FLOOR_CHARS``); counts it if so."""
        if not self.limit:
            return True
        size = max(size, MESSAGE_FLOOR_CHARS)
        if self.used + size > self.limit:
            self.dropped += size
            return False
        self.used += size
        return True

    def take_notice(self) -> str | None:
        """The notice, once, if anything was dropped."""
        if self._noticed or not self.dropped:
            return None
        self._noticed = True
        return self.NOTICE.format(limit=self._limit_text, dropped=_size_text(self.dropped))


def _size_text(chars: int) -> str:
    if chars >= 1048576:
        return f"{chars / 1048576:.1f} MB"
    if chars >= 1024:
        return f"{chars / 1024:.0f} KB"
    return f"{chars} characters"
