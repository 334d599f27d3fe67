"""The shell of trainmedic's self-contained HTML pages (the run report, the comparison).

One page: a style sheet, a script that records script errors (so a broken page
says so), plotly.js embedded once, the body, every figure as JSON in one
``<script type="application/json">`` block, and one script that draws them.
"""

from __future__ import annotations

import html
import json
from typing import Any


def render_page(title: str, body: str, figures: list[dict[str, Any]], style: str = "") -> str:
    """The whole page: ``title`` (escaped here), ``body`` (HTML, already escaped),
    ``figures`` (``{"id", "figure"}`` dicts drawn into the ``div`` of that id) and
    ``style`` added to the shared style sheet."""
    from plotly.offline import get_plotlyjs

    return PAGE.format(
        title=html.escape(title, quote=True),
        style=STYLE + style,
        error_hook=ERROR_HOOK,
        plotlyjs=get_plotlyjs(),
        body=body,
        figures=figures_json(figures),
        draw=DRAW,
    )


def add_figure(fig: Any, figures: list[dict[str, Any]], height: int) -> str:
    fig.update_layout(
        template="plotly_white",
        height=height,
        margin={"l": 60, "r": 30, "t": 40, "b": 50},
        legend={"orientation": "h", "y": -0.08},
        hovermode="x unified",
    )
    div_id = f"plot-{len(figures)}"
    figures.append({"id": div_id, "figure": json.loads(fig.to_json())})
    return f'<div class="plot" id="{div_id}" style="height:{height}px"></div>'


def figures_json(figures: list[dict[str, Any]]) -> str:
    text = json.dumps(figures, separators=(",", ":"))
    # Inside <script>: no "</script>" or "<!--" can appear in the JSON text.
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


STYLE = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2em auto;
max-width:1100px;padding:0 1em;color:#222}
h1{margin-bottom:.3em}h2{border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:1.6em}
table{border-collapse:collapse;margin:.5em 0}th,td{text-align:left;padding:.2em .8em;
vertical-align:top}table.meta th,table.summary th,table.evidence th{color:#555;font-weight:600}
table.events,table.loaders,table.ranks{width:100%}table.ranks td,table.ranks th,
table.events td,table.loaders td,table.events th,table.loaders th{border-bottom:1px solid #eee}
.finding{border-left:6px solid #999;background:#fafafa;padding:.4em 1em;margin:1em 0}
.finding h3{margin:.3em 0}.sev{color:#fff;border-radius:3px;padding:0 .4em;font-size:.8em;
margin-right:.4em}.impact,.subject{color:#666;font-weight:normal;font-size:.85em;
margin-left:.5em}.fix{background:#e8f5e9;padding:.4em .6em;border-radius:3px}
.id{color:#777;font-size:.85em}.empty,.none,.note{color:#666;font-style:italic}
pre{white-space:pre-wrap;font-size:.85em}code{font-size:.95em}
#tm-errors{color:#b71c1c;font-weight:600}.plot{width:100%}
.lede{color:#444;margin-top:0}.lede code{word-break:break-all}
.facts{margin:.3em 0 .5em;padding-left:1.3em}.facts li{margin:.1em 0}
details summary{cursor:pointer;color:#555;font-size:.9em}
.breakdown{display:grid;grid-template-columns:6em 1fr;gap:.2em .8em;align-items:center;
margin:.5em 0}.breakdown .bar{display:flex;height:1.4em;border-radius:3px;overflow:hidden;
background:#eee}.breakdown .part{display:block;height:100%}.breakdown .legend{grid-column:2;
font-size:.9em;color:#333}.breakdown .key{margin-right:1.2em;white-space:nowrap}
.breakdown .swatch{display:inline-block;width:.8em;height:.8em;border-radius:2px;
margin-right:.3em;vertical-align:-.05em}.breakdown .who{color:#555;font-weight:600}
"""

# Runs first: records script errors so a broken page says so (and tests can see it).
ERROR_HOOK = """
window.__tmErrors = [];
function __tmShowErrors() {
  var box = document.getElementById('tm-errors');
  if (box && window.__tmErrors.length) {
    box.hidden = false;
    box.textContent = 'Script errors: ' + window.__tmErrors.join(' | ');
  }
}
function __tmError(msg) { window.__tmErrors.push(String(msg)); __tmShowErrors(); }
window.addEventListener('error', function (e) { __tmError(e.message || e); });
window.addEventListener('unhandledrejection', function (e) { __tmError(e.reason); });
"""

DRAW = """
(function () {
  var figures = JSON.parse(document.getElementById('tm-figures').textContent);
  __tmShowErrors();
  var drawn = figures.map(function (f) {
    return Plotly.newPlot(f.id, f.figure.data, f.figure.layout,
                          {responsive: true, displaylogo: false});
  });
  Promise.all(drawn).then(function () {
    document.body.setAttribute('data-plots-drawn', String(drawn.length));
  }, function (err) { __tmError(err); });
})();
"""

PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="generator" content="trainmedic">
<title>{title}</title>
<style>{style}</style>
<script>{error_hook}</script>
<script>{plotlyjs}</script>
</head>
<body data-plots-drawn="0">
<p id="tm-errors" hidden></p>
{body}
<script type="application/json" id="tm-figures">{figures}</script>
<script>{draw}</script>
</body>
</html>
"""
