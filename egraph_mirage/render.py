"""Graphviz DOT text rendered to SVG, for every drawing of the package (e-graphs, expressions,
μGraphs); a missing ``graphviz`` package or ``dot`` program is a ``RenderError``."""

from __future__ import annotations

from .errors import EMError


class RenderError(EMError, RuntimeError):
    """Graphviz could not render a drawing (most often: the ``dot`` program is not installed)."""


def svg_of_dot(dot: str) -> str:
    """SVG text of DOT source; a missing or failing ``dot`` is a ``RenderError``."""
    try:
        import graphviz
    except ImportError:
        raise RenderError("drawing needs the 'graphviz' Python package: pip install graphviz"
                          ) from None
    try:
        return graphviz.Source(dot).pipe(format="svg", encoding="utf-8", quiet=True)
    except graphviz.ExecutableNotFound:
        raise RenderError("the Graphviz 'dot' program was not found on PATH; install Graphviz "
                          "(Debian/Ubuntu: apt-get install graphviz; macOS: brew install graphviz;"
                          " conda: conda install graphviz)") from None
    except graphviz.CalledProcessError as exc:
        err = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else exc.stderr
        raise RenderError(f"Graphviz 'dot' failed (exit {exc.returncode}): "
                          f"{(err or '').strip()[:400]}") from None
