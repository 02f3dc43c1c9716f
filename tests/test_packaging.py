"""The package as users install it: a wheel built from the checkout, installed into a fresh venv.

The fresh venv sees this interpreter's packages through a ``.pth`` file (nothing is downloaded);
the wheel itself is installed without dependencies.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import sysconfig
import time
import urllib.request
import zipfile
from pathlib import Path

import psutil
import pytest

from inspector.__main__ import main

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    source = tmp_path_factory.mktemp("source")  # setuptools builds in the source tree: build a copy
    for name in [
        "pyproject.toml",
        "README.md",
        "app.py",
        "inspector",
        "sample_models",
        "pages",
        "ui",
        ".streamlit",
    ]:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(ROOT / name, source / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "--no-build-isolation",
                    "--no-index", "-q", "-w", str(out)], check=True, cwd=source, capture_output=True)
    (found,) = out.glob("model_inspector-*.whl")
    return found


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> Path:
    """A fresh venv holding the wheel; returns its bin/ folder."""
    venv = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                             check=True, capture_output=True, text=True).stdout.strip()
    Path(purelib, "shared.pth").write_text(sysconfig.get_path("purelib") + "\n")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "--no-deps",
            "--no-index",
            "-q",
            str(wheel),
        ],
        check=True,
        capture_output=True,
    )
    return venv / "bin"


def test_wheel_holds_templates_schema_samples_typing_marker_and_dashboard(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    data = "model_inspector-0.1.0.data/data/share/model-inspector/"
    for name in ["inspector/templates/report.html.j2", "inspector/report_schema.json", "inspector/py.typed",
                 "sample_models/__init__.py", "sample_models/gpt.py", "inspector/commands/serve.py",
                 data + "app.py", data + "pages/1_Alias_graph.py", data + "ui/navigation.py",
                 data + ".streamlit/config.toml"]:
        assert name in names, name
    assert not any(n.startswith(("tests/", "ui/", "pages/", "benchmarks/")) for n in names)
    metadata = zipfile.ZipFile(wheel).read("model_inspector-0.1.0.dist-info/METADATA").decode()
    requires = [
        line.split(": ", 1)[1] for line in metadata.splitlines() if line.startswith("Requires-Dist: ")
    ]
    hard = [r for r in requires if "extra ==" not in r]
    assert "torch<2.14,>=2.11" in hard
    assert not any(r.startswith(("streamlit", "transformers", "captum", "networkx")) for r in hard), hard
    assert any(r.startswith("streamlit") and 'extra == "app"' in r for r in requires)
    assert any(r.startswith("transformers") and 'extra == "hf"' in r for r in requires)


def test_installed_cli_names_itself_model_inspector(installed, tmp_path):
    bad = subprocess.run([str(installed / "model-inspector"), "summary"], capture_output=True, text=True,
                         cwd=tmp_path)
    assert bad.returncode == 2 and "usage: model-inspector summary" in bad.stderr


def test_cli_names_itself_python_m_inspector_when_run_so(capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", [str(ROOT / "inspector" / "__main__.py")])
    assert main(["--help"]) == 0
    assert capsys.readouterr().out.startswith("usage: python -m inspector ")
    monkeypatch.setattr(sys, "argv", ["/somewhere/bin/model-inspector"])
    assert main(["summary", "--help"]) == 0
    assert capsys.readouterr().out.startswith("usage: model-inspector summary ")


def test_unknown_option_is_refused_outside_serve(capsys):
    assert main(["summary", "sample:tiny_mlp", "--server.port", "1"]) == 2
    assert "unrecognized arguments: --server.port 1" in capsys.readouterr().err


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _healthy(url: str, proc: subprocess.Popen, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as r:
                if r.status == 200:
                    return True
        except OSError:
            time.sleep(0.3)
    return False


def test_serve_starts_the_installed_dashboard(installed, tmp_path):
    port = _free_port()
    log = tmp_path / "serve.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([str(installed / "model-inspector"), "serve", "--port", str(port),
                                 "--server.address", "127.0.0.1"], cwd=tmp_path, stdout=out,
                                stderr=subprocess.STDOUT)
        children = []
        try:
            assert _healthy(f"http://127.0.0.1:{port}", proc, timeout=90), log.read_text()
            children = psutil.Process(proc.pid).children(recursive=True)
            assert children  # the streamlit server
        finally:
            proc.terminate()
            proc.wait(timeout=30)
            _, alive = psutil.wait_procs(children, timeout=30)
            for p in alive:
                p.kill()
        assert not alive, f"terminate() left the server running: {alive}"
    text = log.read_text()
    assert "share/model-inspector/app.py" in text
    assert "--server.maxUploadSize 4096" in text  # the project's .streamlit/config.toml travels along


def test_installed_home_page_runs(installed, tmp_path):
    """The installed app.py finds its ui/ and pages/ and renders the home page."""
    script = ("import sys; from streamlit.testing.v1 import AppTest; "
              "from inspector.dashboard import dashboard_dir; d = dashboard_dir(); print(d); "
              "at = AppTest.from_file(str(d / 'app.py')).run(timeout=60); "
              "assert not at.exception, at.exception; print(at.title[0].value)")
    out = subprocess.run([str(installed / "python"), "-c", script], capture_output=True, text=True,
                         cwd=tmp_path, timeout=120)
    assert out.returncode == 0, out.stderr
    folder, title = out.stdout.split()[0], out.stdout.strip().splitlines()[-1]
    assert folder.endswith("share/model-inspector") and title == "Model Inspector"


def test_serve_without_streamlit_names_the_app_extra(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "streamlit", None)  # as where the app extra is not installed
    assert main(["serve", "--port", "1"]) == 2
    assert ("the dashboard needs streamlit: pip install 'streamlit>=1.67,<2' 'captum>=0.9,<1' (or, in the "
            "model-inspector source folder, pip install '.[app]')") in capsys.readouterr().err


def test_install_hints_name_the_extras_of_pyproject_never_the_public_name():
    """Each hint's packages are the extra's in pyproject.toml; ``pip install 'model-inspector[...]'``
    would install another project of that name from the public index."""
    import tomllib

    from inspector.utils import EXTRAS, install_hint

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for name, packages in EXTRAS.items():
        assert packages == tuple(extras[name]), name
        assert "model-inspector[" not in install_hint(name)
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    assert not [p.name for p in docs if "install 'model-inspector[" in p.read_text(encoding="utf-8")]


@pytest.mark.timeout(300)
def test_make_installs_the_package_editable_so_it_imports_from_anywhere(tmp_path):
    """The Makefile's install step, as make would run it (``make -n``), and that command run against a
    fresh environment: ``import inspector`` then works from another folder, from this source tree."""
    import shutil
    import subprocess
    import sys
    import sysconfig

    where = "import sysconfig; print(sysconfig.get_path('purelib'))"
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    venv = tmp_path / "venv"
    plan = subprocess.run(["make", "-n", "-B", f"VENV={venv}", f"{venv}/.installed"], cwd=ROOT,
                          capture_output=True, text=True, check=True).stdout.splitlines()
    pip = f"{venv}/bin/python -m pip install"
    steps = [line for line in plan if line.startswith(pip)]
    assert steps[-2:] == [f"{pip} -r requirements.txt -c constraints.txt", f"{pip} --no-deps -e ."]
    # the second step into a fresh environment that sees this one's packages (no download needed)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    purelib = subprocess.run([f"{venv}/bin/python", "-c", where],
                             capture_output=True, text=True, check=True).stdout.strip()
    Path(purelib, "outer.pth").write_text(sysconfig.get_path("purelib") + "\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", f"{venv}/bin/python", "install", "-q",
                    "--no-deps", "--no-build-isolation", "-e", "."], cwd=ROOT, check=True,
                   capture_output=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    found = subprocess.run([f"{venv}/bin/python", "-c", "import inspector; print(inspector.__file__)"],
                           cwd=elsewhere, capture_output=True, text=True, check=True).stdout.strip()
    assert Path(found) == ROOT / "inspector" / "__init__.py"
    assert (venv / "bin" / "model-inspector").exists()
