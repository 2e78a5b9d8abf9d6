"""What people read: the progress display, plots and the HTML report."""

from fleetsieve_bayes.exports import lazy_exports

_OWNERS = {
    "make_progress": "fleetsieve_bayes.reporting.progress",
}
__all__ = sorted(_OWNERS)
__getattr__, __dir__ = lazy_exports(__name__, _OWNERS)
