# Run by every kernel the Sandstorm code interpreter starts, before its
# first request (IPKernelApp.exec_files), after charts.py. It adds the
# display formats the E2B SDK reads beyond IPython's own: "e2b/chart" (a
# matplotlib figure's data, charts.py), "e2b/data" (a pandas DataFrame's
# columns, as lists) and "application/json" for plain dicts and lists;
# and makes a PIL image that is shown or saved to a file a displayed PNG,
# since a sandbox has no screen to show it on.
import json as _json
import sys as _sys

from IPython import get_ipython as _get_ipython
from IPython.core.formatters import BaseFormatter as _BaseFormatter
from IPython.core.formatters import JSONFormatter as _JSONFormatter
from traitlets import ObjectName as _ObjectName
from traitlets import Unicode as _Unicode


class _DataFrameColumns(_BaseFormatter):
    format_type = _Unicode("e2b/data")
    print_method = _ObjectName("_repr_e2b_data_")
    _return_type = (dict, str)

    def __call__(self, obj):
        # Only a DataFrame has columns to give, and one can exist only if
        # pandas is imported already: do not import it for every value.
        pd = _sys.modules.get("pandas")
        if pd is None or not isinstance(obj, pd.DataFrame):
            return super().__call__(obj)
        columns = obj.to_dict(orient="list")
        for name, values in columns.items():
            columns[name] = [v.isoformat() if isinstance(v, pd.Timestamp) else v for v in values]
        return columns


def _plain(value):
    # numpy scalars and arrays as the Python numbers and lists they hold.
    for attr in ("tolist", "item"):
        if hasattr(value, attr):
            return getattr(value, attr)()
    return str(value)


class _ContainerJSON(_JSONFormatter):
    def __call__(self, obj):
        if isinstance(obj, (dict, list)):
            try:
                return _json.loads(_json.dumps(obj, default=_plain)), {"expanded": True}
            except (TypeError, ValueError):
                pass
        return super().__call__(obj)


def _install():
    shell = _get_ipython()
    formatters = shell.display_formatter.formatters
    formatters["e2b/data"] = _DataFrameColumns(parent=shell.display_formatter)
    formatters["application/json"] = _ContainerJSON(parent=shell.display_formatter)
    _install_charts(shell)
    try:
        from PIL import Image, ImageShow
    except ImportError:
        return
    from IPython.display import display

    class _DisplayViewer(ImageShow.Viewer):
        def show(self, image, **options):
            display(image)
            return 1

    ImageShow.register(_DisplayViewer, order=-1)
    saved = Image.Image.save

    def save(self, fp, format=None, **params):
        if isinstance(fp, str):
            display(self)
        return saved(self, fp, format, **params)

    Image.Image.save = save


_install()
del _install
