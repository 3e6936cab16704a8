"""Which widgets may reach the browser under the safe output policy, and what of their state is cleaned.

JupyterLab's widget manager picks the code that draws a widget from six names in its state: the
model's module, module version and name, and the view's module, module version and name. A check on
the model alone is not enough: a ``Text`` model drawn by the ``HTMLView`` puts its value into
``innerHTML``. So under the safe policy a widget is shown only when its six names are a combination
ipywidgets 8 ships (``ALLOWED``), those names never change after it opened, and every string its view
renders as markup is cleaned (``MARKUP_VIEWS``' ``value``, and ``description`` while ``description_allow_html``
is set). A link made in the browser (``jslink``/``jsdlink``) copies values without the kernel seeing
them, so a link may only write to traits that are shown as text (``link_refusal``).

The table was read from ipywidgets 8.1's Python classes (their ``_model_*``/``_view_*`` trait
defaults); ``tests/test_hostile_comms.py`` checks it against the installed ipywidgets. The views'
sinks were read from the @jupyter-widgets/controls 2.0 bundle JupyterLab loads: only the HTML and
HTMLMath views set ``innerHTML`` from a model string, and every description label does when
``description_allow_html`` is set (through the frontend's sanitizer, cleaned here as well).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Callable

from .outputs import OutputPolicy, sanitize_html

log = logging.getLogger("daytona_kernel.widgets")

WIDGET_TARGET = "jupyter.widget"
CONTROL_TARGET = "jupyter.widget.control"  # the frontend asks it for every widget's state (a page reload)
BASE, CONTROLS, OUTPUT = "@jupyter-widgets/base", "@jupyter-widgets/controls", "@jupyter-widgets/output"
STANDARD_MODULES = frozenset({BASE, CONTROLS, OUTPUT})
SHIPPED_VERSIONS = {BASE: "2.0.0", CONTROLS: "2.0.0", OUTPUT: "1.0.0"}  # ipywidgets 8's _version.py
IDENTITY_KEYS = (
    "_model_module",
    "_model_module_version",
    "_model_name",
    "_view_module",
    "_view_module_version",
    "_view_name",
)
Identity = tuple[Any, ...]  # the six names, in IDENTITY_KEYS' order; no view: the last three are None

# (model module, model name, view module, view name), each module at its SHIPPED_VERSIONS version.
_CONTROLS_VIEWS = """
Checkbox ToggleButton Valid IntSlider IntRangeSlider Play FloatSlider FloatLogSlider FloatRangeSlider
ColorPicker DatePicker Time ToggleButtons Dropdown RadioButtons Select SelectionSlider SelectMultiple
SelectionRangeSlider HTML HTMLMath Label Textarea Text Password Combobox TagsInput FloatsInput IntsInput
ColorsInput FileUpload Button Box VBox HBox GridBox Accordion Tab Stack ControllerButton ControllerAxis
Controller Image Video Audio IntText FloatText
"""
_OTHER_VIEWS = {  # a model drawn by a view of another name
    "BoundedIntTextModel": "IntTextView",
    "BoundedFloatTextModel": "FloatTextView",
    "IntProgressModel": "ProgressView",
    "FloatProgressModel": "ProgressView",
    "DatetimeModel": "DatetimeView",
    "NaiveDatetimeModel": "DatetimeView",
    "NumbersInputBaseModel": "TagsInputView",
}
_STYLES = """
DescriptionStyle CheckboxStyle ToggleButtonStyle SliderStyle ProgressStyle ToggleButtonsStyle StringStyle
LabelStyle TextStyle HTMLStyle HTMLMathStyle ButtonStyle
"""
_NO_VIEW = "DescriptionModel BoolModel StringModel TagsInputBaseModel DOMWidgetModel WidgetModel LinkModel DirectionalLinkModel"


def _allowed() -> frozenset[tuple[str, str, str | None, str | None]]:
    pairs: set[tuple[str, str, str | None, str | None]] = {
        (CONTROLS, f"{name}Model", CONTROLS, f"{name}View") for name in _CONTROLS_VIEWS.split()
    }
    pairs |= {(CONTROLS, model, CONTROLS, view) for model, view in _OTHER_VIEWS.items()}
    pairs |= {(CONTROLS, f"{name}Model", BASE, "StyleView") for name in _STYLES.split()}
    pairs |= {(CONTROLS, model, None, None) for model in _NO_VIEW.split()}
    pairs |= {
        (BASE, "LayoutModel", BASE, "LayoutView"),
        (BASE, "StyleModel", BASE, "StyleView"),
        (BASE, "DOMWidgetModel", None, None),
        (BASE, "WidgetModel", None, None),
        (OUTPUT, "OutputModel", OUTPUT, "OutputView"),
    }
    return frozenset(pairs)


ALLOWED = _allowed()
MARKUP_VIEWS = frozenset({"HTMLView", "HTMLMathView"})  # they set the model's ``value`` as innerHTML
# The media views make a blob of ``value`` typed ``image/<format>`` (video/, audio/) at the page's origin:
# an SVG one opened in a tab of its own would run its script there. Other formats become the default.
MEDIA_FORMATS = {
    "ImageView": ("png", frozenset({"png", "jpeg", "jpg", "gif", "webp", "bmp", "avif", "x-icon", "url"})),
    "VideoView": ("mp4", frozenset({"mp4", "webm", "ogg", "quicktime", "url"})),
    "AudioView": ("mp3", frozenset({"mp3", "mpeg", "wav", "ogg", "webm", "aac", "flac", "url"})),
}
LINK_MODELS = frozenset({"LinkModel", "DirectionalLinkModel"})
# Traits a browser-side link may never write: the description (HTML when description_allow_html is set),
# references to other models, a media format (see MEDIA_FORMATS), and every _private trait (the six names, _dom_classes ...).
UNLINKABLE = frozenset({"description", "description_allow_html", "layout", "style", "children", "source", "target", "format"})
MODEL_REF = "IPY_MODEL_"


def identity_of(state: dict[str, Any]) -> Identity:
    """The six names of a widget state; a widget without a view has None for the view's three."""
    names = tuple(state.get(key) for key in IDENTITY_KEYS)
    return names if names[5] is not None else names[:3] + (None, None, None)


def is_allowed(identity: Identity) -> bool:
    """Is this a combination ipywidgets 8 ships, each module at the version it ships?"""
    model_module, model_version, model, view_module, view_version, view = identity
    if SHIPPED_VERSIONS.get(model_module) != model_version:
        return False
    if view is not None and SHIPPED_VERSIONS.get(view_module) != view_version:
        return False
    return (model_module, model, view_module, view) in ALLOWED


@dataclass
class Shadow:
    """What the kernel knows of one widget: its six names when it opened, and its description."""

    identity: Identity | None = None  # None: not a widget this policy let through (a control comm, a trusted one)
    fixed: dict[str, Any] = field(default_factory=dict)  # keys whose value may never change
    description: Any = ""
    allow_html: bool = False

    @property
    def model_name(self) -> str:
        return str(self.identity[2]) if self.identity is not None else ""


def shadow_of(state: dict[str, Any], policed: bool) -> Shadow:
    """The shadow of a widget that opened with ``state``; ``policed``: its names are held fixed."""
    identity = identity_of(state)
    fixed = {key: state.get(key) for key in IDENTITY_KEYS} if policed else {}
    if policed and LINK_MODELS & {identity[2]}:
        fixed.update(source=state.get("source"), target=state.get("target"))
    return Shadow(identity if policed else None, fixed, state.get("description", ""), state.get("description_allow_html") is True)


def js_truthy(value: Any) -> bool:
    """How the view's ``if (model.get(...))`` reads a JSON value: every list and object is true."""
    if isinstance(value, (list, dict)):
        return True
    return bool(value)


BLOCKED_NOTICE = (
    "daytona-kernel: {what} was not shown. Under the safe output policy only ipywidgets' own widgets, each "
    "drawn by the view ipywidgets ships for it, reach your browser, and a link made in the browser may not "
    "write what a view shows as HTML, because a widget view runs with your Jupyter token (docs/widgets.md). "
    "If you trust a widget library, add its module to DaytonaKernel.widget_modules; if you trust this "
    "sandbox, set DaytonaKernel.output_policy = 'trusted'. This notice is shown once for each.\n"
)


class WidgetPolicy:
    """Which comms may reach the browser, and what of their state is cleaned (see the module docstring).
    ``extra_modules`` (``widget_modules``) are trusted libraries: their widgets pass, names held fixed."""

    def __init__(self, output: OutputPolicy, extra_modules: frozenset[str] = frozenset()) -> None:
        self.output = output
        self.trusted = output.trusted
        self.extra = extra_modules - STANDARD_MODULES
        self._noticed: set[str] = set()
        self.notices: list[str] = []

    def refusal(self, target_name: str, data: dict[str, Any]) -> str | None:
        """Why a comm the sandbox opens may not reach the browser, or None if it may."""
        if self.trusted:
            return None
        if target_name != WIDGET_TARGET:
            return None if target_name in self.extra else f"a comm on the target {target_name!r:.80}"
        state = data["state"] if isinstance(data.get("state"), dict) else {}
        identity = identity_of(state)
        modules = {identity[0], identity[3]} - {None}
        foreign = modules - STANDARD_MODULES
        if foreign:
            unknown = sorted(str(m)[:80] for m in foreign - self.extra)
            return f"a widget from the module {unknown[0]!r}" if unknown else None
        if not is_allowed(identity):
            shown = ", ".join(f"{key}={value!r:.60}" for key, value in zip(IDENTITY_KEYS, identity) if value is not None)
            return f"a widget with names ipywidgets never ships together ({shown})"
        return None

    def link_refusal(self, state: dict[str, Any], shadow_of_model: Callable[[str], Shadow | None]) -> str | None:
        """Why a link widget may not reach the browser: it writes a trait that is not plain text."""
        model = state.get("_model_name")
        if self.trusted or model not in LINK_MODELS:
            return None
        for end in [state.get("target")] + ([state.get("source")] if model == "LinkModel" else []):
            if not (isinstance(end, list) and len(end) == 2 and all(isinstance(part, str) for part in end)):
                return "a link with a malformed end"
            ref, trait = end
            shadow = shadow_of_model(ref[len(MODEL_REF) :]) if ref.startswith(MODEL_REF) else None
            if shadow is None or shadow.identity is None:
                return "a link to a widget the kernel did not show"
            if trait.startswith("_") or trait in UNLINKABLE or trait in self.markup(shadow) or shadow.model_name in LINK_MODELS:
                return f"a link in the browser writing {shadow.model_name[:60]}.{trait[:60]}"
        return None

    def frontend_target(self, target_name: str) -> bool:
        """May the frontend open this target in the sandbox? (It answers on it.)"""
        return self.trusted or target_name in (WIDGET_TARGET, CONTROL_TARGET) or target_name in self.extra

    def take_notices(self) -> list[str]:
        """The widgets refused since the last call, each said once."""
        notices, self.notices = self.notices, []
        return notices

    def refuse(self, what: str) -> None:
        if what not in self._noticed:
            self._noticed.add(what)
            self.notices.append(BLOCKED_NOTICE.format(what=what))

    def markup(self, shadow: Shadow) -> frozenset[str]:
        """The traits this widget's view sets as HTML (the description apart): the view decides, whatever
        the model (an allowed library's model may be drawn by ipywidgets' HTML view)."""
        names = shadow.identity
        if names is not None and names[3] in STANDARD_MODULES and names[5] in MARKUP_VIEWS:
            return frozenset({"value"})
        return frozenset()

    def shown_key(self, shadow: Shadow, key: Any) -> bool:
        """May a binary buffer set this key of the state? Not a name, nor anything shown as HTML."""
        return self.trusted or not (key in shadow.fixed or key in self.markup(shadow) or key == "description")

    def state(self, shadow: Shadow, state: dict[str, Any], whole: bool = False) -> dict[str, Any]:
        """A widget state fit to show. The names it opened with stay (an update that changes one loses
        that key; a ``whole`` state, the reload reply's, gets them back); what its view shows as HTML is
        cleaned (a value that is not a string becomes empty: a list would be joined into markup); the
        Output widget's outputs pass the output policy."""
        if self.trusted:
            return state
        state = dict(state)
        for key, value in shadow.fixed.items():
            if (key in state or whole) and state.get(key) != value:
                log.info("a widget state tried to change %s to %.80r; kept %.80r", key, state.get(key), value)
                if whole:
                    state[key] = value
                else:
                    del state[key]
        for key in self.markup(shadow) & set(state):
            state[key] = sanitize_html(state[key]) if isinstance(state[key], str) else ""
        media = MEDIA_FORMATS.get(str(shadow.identity[5])) if shadow.identity is not None else None
        if media is not None and "format" in state and state["format"] not in media[1]:
            state["format"] = media[0]
        self._description(shadow, state, whole)
        if isinstance(state.get("outputs"), list):
            state["outputs"] = [self._output(o) for o in state["outputs"] if isinstance(o, dict)]
        return state

    def _description(self, shadow: Shadow, state: dict[str, Any], whole: bool) -> None:
        """The description is HTML while description_allow_html is true (as the view reads it): then the
        shown description is cleaned, and an update that turns it on carries the cleaned description."""
        if "description" in state:
            shadow.description = state["description"]
        if "description_allow_html" in state:
            shadow.allow_html = js_truthy(state["description_allow_html"])
        if shadow.allow_html and (whole or {"description", "description_allow_html"} & set(state)):
            text = shadow.description
            state["description"] = sanitize_html(text) if isinstance(text, str) else ""

    def _output(self, output: dict[str, Any]) -> dict[str, Any]:
        if isinstance(output.get("data"), dict):
            return dict(output, data=self.output.content("display_data", {"data": output["data"]})["data"])
        return output
