# Part of the Sandstorm code interpreter's kernel bootstrap (bootstrap.py
# runs it): the "e2b/chart" display format of a matplotlib Figure — what
# the E2B SDK reads as a result's chart (@e2b/code-interpreter,
# src/charts.ts): its type (line, scatter, bar, pie, box_and_whisker,
# superchart for several axes, unknown), title, axis labels and units
# ("Time (s)" → "s"), scales, ticks and their labels, and its elements
# (points, bars, wedges, boxes). Read off the figure's artists as
# matplotlib made them, without drawing it again; a box plot's statistics
# are kept when it is made (Axes.bxp), as they cannot be read back
# exactly. matplotlib is not imported here: the format is registered by
# the Figure's name and runs only on a figure.
import datetime as _dt
import re as _re


def _num(v):
    try:
        return float(v)
    except (TypeError, ValueError):
        return str(v)


def _unit(label):
    m = _re.search(r"[(\[]([^()\[\]]+)[)\]]\s*$", label or "")
    return m.group(1).strip() if m else None


def _scale(axis, ax_scale):
    conv = type(getattr(axis, "converter", None)).__name__
    if "Date" in conv:
        return "datetime"
    if "StrCategory" in conv:
        return "categorical"
    return ax_scale


def _iso(value):
    import matplotlib.dates as mdates

    return mdates.num2date(float(value)).isoformat()


def _ticks(axis, scale):
    # The locator's ticks in the view: it also gives some just past it.
    lo, hi = sorted(axis.get_view_interval())
    span = (hi - lo) * 1e-9
    locs = [l for l in axis.get_majorticklocs() if lo - span <= l <= hi + span]
    try:
        labels = [str(s) for s in axis.get_major_formatter().format_ticks(locs)]
    except Exception:
        labels = [str(l) for l in locs]
    if scale == "datetime":
        return [_iso(l) for l in locs], labels
    return [_num(l) for l in locs], labels


def _value(v, scale, orig):
    if scale == "datetime":
        return _iso(v)
    if scale == "categorical":
        return str(orig)
    return _num(v)


def _text(t):
    return t if t else None


def _axes2d(ax, kind):
    return {"type": kind, "title": _text(ax.get_title()), "x_label": _text(ax.get_xlabel()), "y_label": _text(ax.get_ylabel()),
            "x_unit": _unit(ax.get_xlabel()), "y_unit": _unit(ax.get_ylabel()), "elements": []}


def _points_chart(ax, kind):
    c = _axes2d(ax, kind)
    xs, ys = _scale(ax.xaxis, ax.get_xscale()), _scale(ax.yaxis, ax.get_yscale())
    c["x_scale"], c["y_scale"] = xs, ys
    c["x_ticks"], c["x_tick_labels"] = _ticks(ax.xaxis, xs)
    c["y_ticks"], c["y_tick_labels"] = _ticks(ax.yaxis, ys)
    if kind == "line":
        for line in ax.get_lines():
            x, y = line.get_xdata(orig=False), line.get_ydata(orig=False)
            ox, oy = line.get_xdata(orig=True), line.get_ydata(orig=True)
            c["elements"].append({"label": line.get_label(), "points": [
                [_value(x[i], xs, ox[i]), _value(y[i], ys, oy[i])] for i in range(len(x))]})
    else:
        for coll in ax.collections:
            offsets = coll.get_offsets()
            c["elements"].append({"label": coll.get_label(), "points": [
                [_value(p[0], xs, p[0]), _value(p[1], ys, p[1])] for p in offsets]})
    return c


def _bar_chart(ax, bars):
    c = _axes2d(ax, "bar")
    fmt = ax.xaxis.get_major_formatter()
    for container in bars:
        for rect in container:
            x = rect.get_x() + rect.get_width() / 2
            try:
                label = str(fmt.format_ticks([x])[0])
            except Exception:
                label = str(x)
            c["elements"].append({"label": label, "value": _num(rect.get_height()), "group": container.get_label()})
    return c


def _box_chart(ax, stats):
    c = _axes2d(ax, "box_and_whisker")
    fmt = ax.xaxis.get_major_formatter()
    for pos, s in stats:
        label = s.get("label")
        if label is None:
            try:
                label = str(fmt.format_ticks([pos])[0])
            except Exception:
                label = str(pos)
        c["elements"].append({"label": str(label), "min": _num(s["whislo"]), "first_quartile": _num(s["q1"]),
                              "median": _num(s["med"]), "third_quartile": _num(s["q3"]), "max": _num(s["whishi"]),
                              "outliers": [_num(f) for f in s.get("fliers", [])]})
    return c


def _pie_chart(ax, wedges):
    return {"type": "pie", "title": _text(ax.get_title()), "elements": [
        {"label": w.get_label(), "angle": round(abs(w.theta2 - w.theta1), 4), "radius": _num(w.r)} for w in wedges]}


def _axes_chart(ax):
    from matplotlib.container import BarContainer
    from matplotlib.patches import Wedge

    ax.get_xlim(), ax.get_ylim()  # the autoscaling matplotlib defers to the draw
    stats = getattr(ax, "_sandstorm_boxes", None)
    if stats:
        return _box_chart(ax, stats)
    wedges = [p for p in ax.patches if isinstance(p, Wedge)]
    if wedges:
        return _pie_chart(ax, wedges)
    bars = [b for b in ax.containers if isinstance(b, BarContainer)]
    if bars:
        return _bar_chart(ax, bars)
    if ax.get_lines():
        return _points_chart(ax, "line")
    if ax.collections:
        return _points_chart(ax, "scatter")
    return {"type": "unknown", "title": _text(ax.get_title()), "elements": []}


def _figure_chart(fig):
    try:
        axes = [ax for ax in fig.get_axes() if ax.get_visible() and not hasattr(ax, "_colorbar")]
        if not axes:
            return None
        charts = [_axes_chart(ax) for ax in axes]
        suptitle = getattr(fig, "_suptitle", None)
        title = _text(suptitle.get_text()) if suptitle is not None else None
        if len(charts) == 1:
            if charts[0]["title"] is None and title is not None:
                charts[0]["title"] = title
            return charts[0]
        return {"type": "superchart", "title": title, "elements": charts}
    except Exception:
        return None  # a figure we cannot read is still its PNG


def _keep_box_stats(axes_module):
    # Axes.bxp draws a box plot from its statistics (Axes.boxplot calls
    # it); they are kept on the axes, by position, for _box_chart.
    Axes = axes_module.Axes
    drawn = Axes.bxp

    def bxp(self, bxpstats, positions=None, *args, **kwargs):
        out = drawn(self, bxpstats, positions, *args, **kwargs)
        stats = list(bxpstats)
        pos = list(positions) if positions is not None else list(range(1, len(stats) + 1))
        self._sandstorm_boxes = getattr(self, "_sandstorm_boxes", []) + list(zip(pos, stats))
        return out

    Axes.bxp = bxp


def _chart_repr(figure_module):
    # The chart is the Figure's own _repr_e2b_chart_, which the format
    # calls: a printer registered for the Figure type would not last, as
    # IPython drops every formatter's Figure printer when it sets the
    # inline backend up (select_figure_formats).
    figure_module.Figure._repr_e2b_chart_ = _figure_chart


# What is done to matplotlib's modules once they are imported.
_patches = {"matplotlib.axes": _keep_box_stats, "matplotlib.figure": _chart_repr}


def _install_charts(shell):
    import importlib.abc
    import importlib.util
    import sys

    from IPython.core.formatters import BaseFormatter
    from traitlets import ObjectName, Unicode

    class _ChartFormatter(BaseFormatter):
        format_type = Unicode("e2b/chart")
        print_method = ObjectName("_repr_e2b_chart_")
        _return_type = (dict,)

    shell.display_formatter.formatters["e2b/chart"] = _ChartFormatter(parent=shell.display_formatter)

    # matplotlib is not imported here: each module is patched as it is
    # imported (one already imported, at once).
    pending = dict(_patches)
    for name in list(pending):
        if name in sys.modules:
            pending.pop(name)(sys.modules[name])
    if not pending:
        return

    class _Hook(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            patch = pending.pop(name, None)
            if patch is None:
                return None
            if not pending:
                sys.meta_path.remove(self)
            spec = importlib.util.find_spec(name)
            exec_module = spec.loader.exec_module

            def run(module):
                exec_module(module)
                patch(module)

            spec.loader.exec_module = run
            return spec

    sys.meta_path.insert(0, _Hook())
