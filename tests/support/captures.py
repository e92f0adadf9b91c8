"""Reading the shared nvidia-smi captures (../shared/fixtures/nvidia-smi, never copied here)
and our own fixtures (tests/fixtures/nvidia-smi-own)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SHARED = ROOT.parent / "shared" / "fixtures" / "nvidia-smi"
OWN = ROOT / "tests" / "fixtures" / "nvidia-smi-own"


def list_section(capture: str) -> str:
    """The ``nvidia-smi -L`` output inside a full nvidia_gpu_exporter capture file."""
    lines = capture.splitlines()
    start = lines.index("# $ nvidia-smi -L") + 2          # skip the '####' rule after it
    out = []
    for line in lines[start:]:
        if line.startswith("#####"):
            break
        out.append(line)
    return "\n".join(out)


def fake_nvidia_smi(directory: Path, list_text: str, xml_text: str) -> Path:
    """An ``nvidia-smi`` executable in ``directory`` that prints captured output for ``-L``
    and ``-q -x``: the real binary's interface, fed with real captures."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "L.txt").write_text(list_text)
    (directory / "q.xml").write_text(xml_text)
    script = directory / "nvidia-smi"
    script.write_text(
        "#!/bin/sh\n"
        f'case "$*" in\n  "-L") cat "{directory}/L.txt" ;;\n'
        f'  "-q -x") cat "{directory}/q.xml" ;;\n'
        '  *) echo "fake nvidia-smi: unsupported arguments: $*" >&2; exit 2 ;;\nesac\n')
    script.chmod(0o755)
    return script
