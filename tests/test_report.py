"""Reports: JSON against the schema and back, stable output, Markdown tables, escaped names."""

from __future__ import annotations

import json
import re
import sys

import jsonschema
import pytest
import torch
from torch import nn

from inspector import Finding, InspectorError, LoadedModel, load_model
from inspector.__main__ import main
from inspector.report import (
    PACK_ALPHABET,
    SECTION_BUILDERS,
    SECTIONS,
    PackedScript,
    Report,
    Section,
    Table,
    build_report,
    load_schema,
    make_figure,
    plain,
    render_pdf,
)

HOSTILE = "<img src=x onerror=alert(1)>"


class Hostile(nn.Module):
    """A ModuleDict key may hold anything but a dot: here, an HTML tag with a script in it.

    Parameters: blocks.<HOSTILE>.weight 2*2 = 4, .bias 2, head.weight 2*2 = 4 -> 10 elements.
    """

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleDict({HOSTILE: nn.Linear(2, 2)})
        self.head = nn.Linear(2, 2, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks[HOSTILE](x))


def hostile_loaded() -> LoadedModel:
    torch.manual_seed(0)
    finding = Finding("hostile-name", "warning", f"blocks.{HOSTILE}.weight",
                      f"module {HOSTILE} has a name made of HTML")
    return LoadedModel(Hostile(), f"<script>alert('name')</script>{HOSTILE}", "test:hostile",
                       findings=[finding], inputs_fn=lambda b: torch.ones(b, 2),
                       loss_fn=lambda out, inp: out.pow(2).mean())


@pytest.fixture(scope="module")
def tiny_report() -> Report:
    return build_report(load_model("sample:tiny-gpt2"))


def test_json_validates_against_the_schema_and_round_trips(tiny_report):
    text = tiny_report.to_json()
    data = json.loads(text)
    schema = load_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.validate(data, schema)
    assert data["schema_version"] == "1.0"
    assert [s["id"] for s in data["sections"]] == list(SECTIONS)
    back = Report.from_json(text)
    assert back == tiny_report
    assert back.to_json() == text
    # tiny-gpt2: 4080 unique parameter elements, 4592 counting the tie (16*32 = 512) twice
    facts = data["sections"][1]["facts"]
    assert (facts["parameter_elements"], facts["parameter_elements_with_aliases"]) == (4080, 4592)


def test_schema_rejects_a_broken_report(tiny_report):
    data = json.loads(tiny_report.to_json())
    data["findings"].append(
        {"code": "x", "severity": "fatal", "where": "", "message": "", "section": "summary"}
    )
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(data, load_schema())


def test_two_reports_of_one_model_differ_only_in_the_timestamp(tiny_report):
    again = json.loads(build_report(load_model("sample:tiny-gpt2")).to_json())
    first = json.loads(tiny_report.to_json())
    assert first.pop("created") and again.pop("created")
    assert _differences(first, again) == []


def _differences(a, b, path: str = "") -> list[str]:
    """Paths where two JSON values differ (empty when they are equal)."""
    if type(a) is not type(b):
        return [f"{path}: {a!r:.80} != {b!r:.80}"]
    if isinstance(a, dict):
        return [d for k in sorted(set(a) | set(b)) for d in _differences(a.get(k), b.get(k), f"{path}.{k}")]
    if isinstance(a, list):
        if len(a) != len(b):
            return [f"{path}: {len(a)} items != {len(b)}"]
        return [
            d for i, (x, y) in enumerate(zip(a, b, strict=True)) for d in _differences(x, y, f"{path}[{i}]")
        ]
    return [] if a == b else [f"{path}: {a!r:.80} != {b!r:.80}"]


def test_markdown_has_the_headings_and_the_4080_of_tiny_gpt2(tiny_report):
    md = tiny_report.to_markdown()
    lines = md.splitlines()
    assert lines[0] == "# Model report: tiny-gpt2"
    headings = [line for line in lines if line.startswith("## ")]
    assert headings[:2] == ["## Findings", "## Summary"]
    assert len(headings) == len(SECTIONS)
    assert "| parameter elements | 4,080 |" in lines
    assert "| parameter elements with aliases | 4,592 |" in lines
    assert "| key | value |" in lines and "| --- | --- |" in lines
    # every table row has as many cells as its header
    for i, line in enumerate(lines):
        if line.startswith("|") and i + 1 < len(lines) and lines[i + 1].startswith("| ---"):
            width = line.count(" | ")
            j = i + 2
            while j < len(lines) and lines[j].startswith("|"):
                assert lines[j].replace("\\|", "").count(" | ") == width, lines[j]
                j += 1


def test_findings_come_first_most_severe_first_each_naming_its_section():
    loaded = hostile_loaded()
    loaded.findings.append(Finding("bad", "error", "head.weight", "an error"))
    report = build_report(loaded, ["summary"])
    assert [s.id for s in report.sections] == ["findings", "summary"]
    assert [(sid, f.code) for sid, f in report.findings][:2] == [
        ("summary", "bad"),
        ("summary", "hostile-name"),
    ]
    html = report.to_html()
    assert html.index('id="section-findings"') < html.index('id="section-summary"')
    assert 'href="#section-summary"' in html


def test_hostile_module_name_stays_escaped_text():
    report = build_report(hostile_loaded())
    html = report.to_html()
    assert HOSTILE not in html
    assert "<script>alert(" not in html
    assert "&lt;img src=x onerror=alert(1)&gt;" in html
    md = report.to_markdown()
    assert HOSTILE not in md and "&lt;img src=x onerror=alert\\(1\\)&gt;" in md
    # the JSON keeps the real name
    assert HOSTILE in json.loads(report.to_json())["model"]["name"]


def test_figures_are_inlined_once_and_escaped_inside_the_script():
    import plotly.graph_objects as go
    from plotly.offline import get_plotlyjs

    fig = go.Figure(go.Bar(x=[HOSTILE, "b"], y=[1.5, 2.0], name="norms"))
    section = Section("offsets", "Offsets", figures=(make_figure("norms", fig), make_figure("again", fig)))
    report = Report({"name": "m", "source": "s", "device": "cpu", "dtype": None, "checkpoint": None,
                     "class": "M"}, {}, (Section("findings", "Findings"), section), "t")
    html = report.to_html()
    assert html.count("Plotly.newPlot") == 1  # one loop draws every figure
    assert html.count('class="figure"') == 2
    # one packed copy of plotly.js for both figures, which unpacks to the installed one exactly
    assert html.count('id="report-plotly"') == 1 and "* plotly.js v" not in html
    packed = re.search(
        r'id="report-plotly" data-alphabet="([^"]*)" data-packed="(\d+)" data-size="(\d+)">([^<]*)<', html)
    assert packed.group(1) == PACK_ALPHABET
    script = PackedScript(packed.group(4), int(packed.group(2)), int(packed.group(3)))
    assert script.unpack() == get_plotlyjs()
    assert len(html) < len(get_plotlyjs()) / 3
    assert HOSTILE not in html and "</script><script" not in html
    # the figure's data became plain lists and the summary table describes the trace
    f = report.sections[1].figures[0]
    assert f.figure["data"][0]["y"] == [1.5, 2.0]
    assert f.summary.rows == (("norms", "bar", 2, 1.5, 2.0),)
    assert "### Figure: norms" in report.to_markdown()


def test_the_html_report_of_a_small_model_stays_under_one_and_a_half_megabytes(tiny_report):
    html = tiny_report.to_html().encode("utf-8")
    assert 1_000_000 < len(html) <= 1_500_000  # 4,080 parameters: 1.39 MB of packed plotly.js, the data
    assert set(PACK_ALPHABET) <= set(map(chr, range(33, 127))) and not set("<>&\"'") & set(PACK_ALPHABET)


def test_unknown_section_or_option_is_a_clear_error():
    loaded = load_model("sample:tiny-gpt2")
    with pytest.raises(InspectorError, match="unknown report section.*'bogus'.*choose from"):
        build_report(loaded, ["bogus"])
    with pytest.raises(InspectorError, match="unknown report option.*colour"):
        build_report(loaded, ["summary"], colour="red")


def test_a_missing_analysis_is_skipped_with_a_note(monkeypatch):
    monkeypatch.setitem(sys.modules, "inspector.attribution", None)  # import fails, as without captum
    report = build_report(load_model("sample:cnn-bn"), ["summary", "attribution"])
    attribution = report.section("attribution")
    assert attribution.status == "skipped"
    assert attribution.note.startswith("inspector.attribution is not available (")
    assert report.section("summary").status == "ok"
    monkeypatch.delitem(SECTION_BUILDERS, "labs")
    labs = build_report(load_model("sample:cnn-bn"), ["labs"], lab="broken-tie").section("labs")
    assert (labs.status, labs.note) == ("skipped", "this section has no builder in this installation")


def test_sections_on_the_meta_device_skip_what_needs_numbers():
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))  # 20 + 10 = 30 elements
    loaded = LoadedModel(model, "meta-mlp", "test:meta", device="meta",
                         inputs_fn=lambda b: torch.zeros(b, 4))
    report = build_report(loaded)
    assert report.section("summary").facts["parameter_elements"] == 30
    for sid in ("captures", "attribution"):
        s = report.section(sid)
        assert s.status == "skipped" and s.note, (sid, s)
    assert all(s.status in ("ok", "skipped") for s in report.sections)


def test_plain_values_are_stable_and_json_safe():
    assert plain(0.1 + 0.2) == 0.3  # 8 significant digits: 0.30000000000000004 -> 0.3
    assert plain(float("-inf")) == "-inf" and plain(float("nan")) == "nan"
    assert plain({"a": (1, 2.5)}) == {"a": [1, 2.5]}
    assert plain(torch.Size([2, 3])) == [2, 3]
    assert plain(torch.float16) == "torch.float16"
    t = Table.from_mapping("t", {"x": float("inf")})
    assert t.rows == (("x", "inf"),)


def test_pdf_without_chromium_is_a_clear_error(tmp_path):
    report = Report({"name": "m"}, {}, (Section("findings", "Findings"),), "t")
    with pytest.raises(InspectorError, match="PDF export needs Chromium at /nonexistent/chromium"):
        render_pdf(report, tmp_path / "r.pdf", chromium="/nonexistent/chromium")
    assert not (tmp_path / "r.pdf").exists()


def test_cli_writes_each_format(tmp_path, capsys):
    out = tmp_path / "r.json"
    assert main(["report", "sample:tiny-gpt2", "--sections", "summary", "-o", str(out)]) == 0
    data = json.loads(out.read_text())
    jsonschema.validate(data, load_schema())
    assert [s["id"] for s in data["sections"]] == ["findings", "summary"]
    err = capsys.readouterr().err
    assert "report section summary" in err and f"wrote {out}" in err
    md = tmp_path / "r.md"
    assert main(["report", "sample:tiny-gpt2", "--sections", "summary", "--format", "md", "-o", str(md)]) == 0
    assert "| parameter elements | 4,080 |" in md.read_text()
    assert main(["report", "sample:tiny-gpt2", "--sections", "bogus", "-o", str(md)]) == 2
    assert "unknown report section" in capsys.readouterr().err


def test_tiny_gpt2_sections_hold_what_the_analyses_found(tiny_report):
    r = tiny_report
    # one tie: lm_head.weight is transformer.wte.weight, 32*16 = 512 elements, 2048 bytes
    aliases = r.section("aliases")
    assert aliases.tables[0].rows[0][:5] == (
        "transformer.wte.weight, lm_head.weight",
        "same-object",
        1,
        512,
        2048,
    )
    conv = aliases.tables[1]
    col = {c: i for i, c in enumerate(conv.columns)}
    broken = [row for row in conv.rows if row[col["outcome"]] == "broken"]
    assert broken and all(row[col["unique"]] == 4592 for row in broken)  # the tie counted twice
    assert [f.title for f in aliases.figures] == ["Alias graph"]
    # flat vector: 4080 elements; the tied weight appears once, first, at 0..512
    offsets = r.section("offsets")
    assert offsets.facts == {"tensors": 16, "vector_length": 4080}
    assert offsets.tables[0].rows[0][:6] == (
        "transformer.wte.weight",
        ["lm_head.weight"],
        "transformer.wte",
        0,
        512,
        512,
    )
    assert "no gradients yet" in offsets.note
    # 16 parameters + the alias name lm_head.weight + the mask buffer = 18 rows, all on cpu
    placement = r.section("placement")
    assert placement.facts == {"tensors": 18, "devices_now": ["cpu"]}
    assert "no device budget given" in placement.note
    assert r.section("captures").facts["captured"] == 15
    attribution = r.section("attribution")
    assert attribution.facts["layer"] == "transformer.wte" and attribution.facts["method"] == "layer_ig"
    assert r.section("labs").status == "skipped"
    html = r.to_html()
    n_figures = sum(len(s.figures) for s in r.sections)
    assert (
        html.count('class="figure"') == n_figures == 6
    )  # five analyses' figures and the summary's model tree


def test_backward_option_reports_gradients_and_leaves_grad_alone():
    loaded = load_model("sample:frozen-adapter")
    first = next(p for p in loaded.model.parameters() if p.requires_grad)
    earlier = torch.full_like(first, 7.0)
    first.grad = earlier
    report = build_report(loaded, ["offsets"], backward=True)
    assert first.grad is earlier  # the very same tensor, values untouched
    assert all(p.grad is None for p in loaded.model.parameters() if p is not first)
    offsets = report.section("offsets")
    titles = [t.title for t in offsets.tables]
    assert titles == ["Flat offset map", "Flat offset map of the trainable parameters only",
                      "Gradient norms per parameter", "Gradient norms per module"]
    # 3 LoRA layers: 6 trainable (lora_A, lora_B) and 6 frozen (base weight, bias) parameters
    assert (offsets.facts["grad_ok"], offsets.facts["grad_frozen"]) == (6, 6)
    assert "no .grad was set" in offsets.note
    assert [f.title for f in offsets.figures] == ["Flat vector", "Gradient norm per layer"]


def test_plan_with_a_budget_places_the_split_blocks_buffers():
    # split-block, float32: embed 16384 + 256 bytes, block.fc1..3 16640 each, block.scale 256,
    # block.pos_table 4096, head 2080. With 40000 + 38000 bytes on the GPUs the model (72992) does
    # not fit once the block's buffers are counted, so GPU 0 keeps a Linear (16640) free: the block
    # is split, fc1 and fc2 go to GPU 1, fc3 to the CPU, so GPU 1 holds most of the block's bytes
    # and gets its buffers (33280 + 4352 = 37632 <= 38000).
    loaded = load_model("sample:split-block")
    report = build_report(loaded, ["placement"], max_memory="0=40000,1=38000,cpu=100000")
    s = report.section("placement")
    assert s.status == "ok" and s.facts["accelerate_check"] == "passed"
    audit = next(t for t in s.tables if t.title.startswith("Audit of the plan"))
    col = {c: i for i, c in enumerate(audit.columns)}
    devices = {row[col["name"]]: row[col["device"]] for row in audit.rows}
    assert (devices["block.scale"], devices["block.pos_table"], devices["block.fc3.weight"]) == (1, 1, "cpu")
    # accelerate's infer_auto_device_map leaves exactly those two buffers out of its map
    diff = s.tables[-1]
    assert [(r[0], r[2], r[3]) for r in diff.rows] == [("block.scale", 1, None), ("block.pos_table", 1, None)]
    assert "block.scale, block.pos_table" in s.facts["accelerate_infer_auto_device_map_check"]
    assert [f.title for f in s.figures] == ["Where every tensor is now", "Planned device map",
                                           "Bytes per device against the budget"]
    bad = build_report(loaded, ["placement"], max_memory="0=3x")
    assert bad.section("placement").status == "skipped"
    assert "cannot read '3x'" in bad.section("placement").note


def test_conversions_option_and_lab_results():
    loaded = load_model("sample:tiny-gpt2")
    none = build_report(loaded, ["aliases"], conversions=[])
    assert [t.title for t in none.section("aliases").tables] == ["Alias groups"]
    wrong = build_report(loaded, ["aliases"], conversions=["to-nowhere"])
    assert wrong.section("aliases").status == "skipped" and "to-nowhere" in wrong.section("aliases").note
    lab = build_report(loaded, ["labs"], lab="broken-tie", student="Ada")
    s = lab.section("labs")
    assert s.status == "ok" and s.facts["lab"] == "broken-tie" and s.facts["passed"] == 0
    assert lab.options["lab"] == "broken-tie" and "lab_progress" not in lab.options
    assert all(f.code == "lab-task-open" for f in s.findings)
    jsonschema.validate(json.loads(lab.to_json()), load_schema())


def test_a_section_that_raises_becomes_an_error_section_and_an_error_finding(monkeypatch):
    def broken(ctx):
        raise RuntimeError("analysis bug")

    monkeypatch.setitem(SECTION_BUILDERS, "labs", broken)
    report = build_report(load_model("sample:tiny-gpt2"), ["summary", "labs"])
    labs = report.section("labs")
    assert (labs.status, labs.note) == ("error", "RuntimeError: analysis bug")
    sid, first = report.findings[0]
    assert (sid, first.code, first.severity) == ("labs", "report-section-failed", "error")
    assert report.section("summary").status == "ok"
    assert "**Error:** RuntimeError: analysis bug" in report.to_markdown()


def test_gradients_option_reports_given_gradients_and_ignores_grad():
    from inspector.offsets import loss_gradients

    loaded = load_model("sample:frozen-adapter")
    mine = loss_gradients(loaded)
    first = next(p for p in loaded.model.parameters() if p.requires_grad)
    first.grad = torch.full_like(first, float("nan"))  # someone else's gradient on the shared model
    offsets = build_report(loaded, ["offsets"], gradients=mine.grads).section("offsets")
    assert (offsets.facts["grad_ok"], offsets.facts["grad_nonfinite"], offsets.facts["grad_frozen"]) == (
        6,
        0,
        6,
    )
    # an empty mapping means "no gradients in this session": .grad is not read either
    empty = build_report(loaded, ["offsets"], gradients={}).section("offsets")
    assert "grad_ok" not in empty.facts and "no gradients yet" in empty.note
    assert "gradients" not in build_report(loaded, ["summary"], gradients={}).options
