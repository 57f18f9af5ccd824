"""One self-contained HTML page for the record: decision, ladder, conditions, sign-off, figures, plots.

Self-contained because the page is what gets attached to a release ticket or an artifact store and
opened years later: the plots are embedded as base64 PNGs, the styles are inline, and nothing is
fetched. The page is a rendering of ``record.json``; the JSON is the record.
"""

from __future__ import annotations

import base64
import html
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from lightning_field.record.collect import cited_digest

STATUS_COLOUR = {"pass": "#1a7f37", "fail": "#cf222e", "missing": "#9a6700", "stale": "#9a6700"}
STYLE = """
body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:24px;color:#1f2328;max-width:1150px}
h1{font-size:26px;margin:0 0 6px}h2{font-size:19px;margin-top:28px;border-bottom:1px solid #d0d7de;padding-bottom:4px}
table{border-collapse:collapse;width:100%;font-size:13px;margin:8px 0}
th,td{border:1px solid #d0d7de;padding:4px 6px;text-align:left;vertical-align:top;overflow-wrap:break-word}
th{background:#f6f8fa}.verdict{display:inline-block;padding:8px 18px;border-radius:6px;color:#fff;font-size:22px;
font-weight:700}.go{background:#1a7f37}.hold{background:#cf222e}.small{font-size:12px;color:#57606a}
code{font-size:12px;word-break:break-all}.status{font-weight:700}
img{max-width:100%;border:1px solid #d0d7de;margin:6px 0}
"""


def _e(value: Any) -> str:
    return html.escape(str(value))


def fmt(value: Any) -> str:
    """A figure's value in one line: numbers to 4 significant digits, mappings as key: value pairs."""
    if isinstance(value, bool) or value is None:
        return {True: "yes", False: "no", None: "n/a"}[value]
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, Mapping):
        return "; ".join(f"{k}: {fmt(v)}" for k, v in value.items() if not isinstance(v, (list, Mapping)) or v)
    if isinstance(value, (list, tuple)):
        return ", ".join(fmt(v) for v in value) or "none"
    return str(value)


def _status(status: str) -> str:
    return f'<span class="status" style="color:{STATUS_COLOUR.get(status, "#1f2328")}">{_e(status.upper())}</span>'


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{cell}</td>" for cell in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _image(path: Path, caption: str) -> str:
    data = base64.b64encode(path.read_bytes()).decode()
    return f'<figure><img alt="{_e(caption)}" src="data:image/png;base64,{data}"><figcaption class="small">' \
           f"{_e(caption)}</figcaption></figure>"  # fmt: skip


def render_html(record: Mapping[str, Any], record_dir: Path, signature_state: Mapping[str, Any]) -> str:
    """``signature_state``: ``valid``, ``problems`` and ``missing`` from ``signing``, shown as they are now."""
    decision, exposure, release = record["decision"], record["exposure"], record["release"]
    verdict = decision["verdict"]
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>Release record: {_e(verdict.upper())}</title><style>{STYLE}</style></head><body>",
        "<h1>Release record</h1>",
        f"<p class='small'>Built {_e(record['created'])} by lightning_field {_e(record['tool_version'])};"
        f" content SHA-256 <code>{_e(record.get('content_sha256', ''))}</code></p>",
        f"<p><span class='verdict {_e(verdict)}'>{'GO' if verdict == 'go' else 'HOLD'}</span>"
        # The decision approves only the exposure the evidence supports, so the two are read together.
        + (
            f" &nbsp;for exposure up to <b>{_e(exposure['supported'])}</b>"
            if verdict == "go" and exposure["supported"]
            else " &nbsp;on every critical condition, but <b>no exposure level is supported yet</b>"
            if verdict == "go"
            else ""
        )
        + "</p>",
        f"<p>Rule: {_e(decision['rule'])}.</p>",
        f"<p>Released run: <code>{_e(release.get('run_dir'))}</code>, checkpoint <code>{_e(release.get('checkpoint'))}"
        f"</code> (step {_e(release.get('step'))}); code {_e(release.get('code_version'))}; config hash"
        f" <code>{_e(str((release.get('identity') or {}).get('config.hash'))[:16])}</code> over"
        f" {_e(', '.join((record['config'].get('identity') or {}).get('config_keys') or []))}.</p>",
    ]
    if decision["held_by"]:
        parts.append("<p><b>Held by:</b></p><ul>")
        parts += [f"<li>{_e(h['name'])} ({_status(h['status'])}): {_e(h['detail'])}</li>" for h in decision["held_by"]]
        parts.append("</ul>")

    parts.append("<h2>Exposure</h2>")
    parts.append(f"<p><b>Supported:</b> {_e(exposure['supported'] or 'none')} — {_e(exposure['why'])}</p>")
    if exposure["next"]:
        lacks = "; ".join(f"{x['name']} ({x['status']}: {x['detail']})" for x in exposure["next_lacks"])
        parts.append(f"<p><b>Next level, {_e(exposure['next'])}, lacks:</b> {_e(lacks)}</p>")
    parts.append(_table(["level", "description", "requires", "supported", "lacking"], [
        [_e(r["level"]), _e(r["description"]), _e(", ".join(r["requires"]) or "-"), "yes" if r["supported"] else "no",
         _e(", ".join(x["name"] for x in r["lacking"]) or "-")] for r in exposure["levels"]
    ]))  # fmt: skip

    parts.append("<h2>Conditions</h2>")
    parts.append(_table(["condition", "severity", "status", "detail", "max age", "identity compared", "signed by"], [
        [_e(c["name"]), _e(c["severity"]), _status(c["status"]), _e(c["detail"]),
         _e(f"{c['max_age_hours']:g} h" if c["max_age_hours"] else "none"), _e(", ".join(c["compare_identity"]) or "-"),
         _e(", ".join(c["roles"]) or "-")] for c in record["conditions"]
    ]))  # fmt: skip

    parts.append("<h2>Sign-off</h2>")
    parts.append("<p class='small'>Signatures are accountability, not cryptographic identity: each records a typed"
                 " name, role, time and note over the SHA-256 of this record's content.</p>")  # fmt: skip
    rows = [[_e(s["role"]), _e(s["name"]), _e(s["time"]), _e(s["note"]), "valid"] for s in signature_state["valid"]]
    rows += [["", "", "", _e(p), "<b style='color:#cf222e'>INVALID</b>"] for p in signature_state["problems"]]
    parts.append(_table(["role", "name", "time", "note", "state"], rows) if rows else "<p>No signatures yet.</p>")
    for line in signature_state["missing"]:
        parts.append(f"<p class='small'>{_e(line)}</p>")

    parts.append("<h2>Plots</h2>")
    for plot in record["plots"]:
        path = record_dir / plot["file"] if not Path(plot["file"]).is_absolute() else Path(plot["file"])
        if path.is_file():
            parts.append(_image(path, plot["caption"]))
        else:
            parts.append(f"<p class='small'>plot missing: {_e(plot['file'])}</p>")

    parts.append("<h2>Figures</h2>")
    parts.append(_table(
        ["figure", "value", "source (digest)", "config hash", "code", "date", "population / denominator",
         "limitations"],
        [[_e(f["label"]) + (" <i>(estimate)</i>" if f["estimate"] else ""),
          _e(fmt(f["value"]) + (f" {f['unit']}" if f["unit"] and isinstance(f["value"], (int, float)) else "")),
          f"<code>{_e(f['source']['path'])}</code> <code>{_e(cited_digest(f['source'])[:19])}</code>",
          f"<code>{_e(str(f['config_hash'])[:12])}</code>", _e(f["code_version"]), _e(f["date"]),
          _e(f"{f['population']} / {f['denominator']}"), _e("; ".join(f["limitations"]) or "-")]
         for f in record["figures"]],
    ))  # fmt: skip

    if record.get("plan_vs_measured"):
        parts.append("<h2>Plan next to what was measured</h2>")
        parts.append(_table(["quantity", "planned (estimate)", "measured", "unit"], [
            [_e(r["quantity"]), _e(fmt(r["planned"])), _e(fmt(r["measured"])), _e(r["unit"])]
            for r in record["plan_vs_measured"]
        ]))  # fmt: skip

    parts.append("<h2>Sources</h2>")
    parts.append(_table(["id", "kind", "path", "digest", "date", "code", "linked or copied"], [
        [_e(s["id"]), _e(s["kind"]), f"<code>{_e(s['path'])}</code>", f"<code>{_e(cited_digest(s))}</code>",
         _e(f"{s['date']} ({s['date_basis']})"), _e(s["code_version"]), _e(s["copied_to"] or "linked")]
        for s in record["sources"]
    ]))  # fmt: skip
    if record["not_found"]:
        parts.append("<p><b>Looked for but not found:</b></p><ul>")
        parts += [f"<li class='small'>{_e(n)}</li>" for n in record["not_found"]]
        parts.append("</ul>")
    parts.append("<h2>Limitations</h2><ul>")
    parts += [f"<li>{_e(x)}</li>" for x in record["limitations"]]
    parts.append("</ul>")
    parts.append(f"<details><summary class='small'>Record configuration</summary><pre class='small'>"
                 f"{_e(json.dumps(record['config'], indent=1))}</pre></details>")  # fmt: skip
    parts.append("</body></html>")
    return "\n".join(parts)
