"""Discovery through both sources on a real GPU machine (see gpu-check.sh)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from llmgw_runtime.devices.nvidia_smi import FileRunner, NvidiaSmiSource
from llmgw_runtime.devices.nvml import real_source


def main(out: Path) -> int:
    by_nvml = real_source().discover()
    by_smi = NvidiaSmiSource(FileRunner(out / "nvidia-smi-L.txt",
                                        out / "nvidia-smi-q-x.xml")).discover()
    report = {}
    for name, found in (("nvml", by_nvml), ("nvidia-smi", by_smi)):
        report[name] = {"driver_version": found.driver_version, "problems": found.problems,
                        "cards": [c.to_dict() for c in found.cards],
                        "devices": found.to_dicts()}
        print(f"{name}: {len(found.cards)} card(s), {len(found.devices)} device(s), "
              f"problems: {found.problems or 'none'}")
        for dev in found.devices:
            print(f"  {dev.label:8} {dev.klass:28} {dev.memory_used_mb}/{dev.memory_total_mb}"
                  f" MiB  {dev.uuid}  {'ok' if dev.healthy else dev.reason}")
    # Readings (memory used, temperature, power) move between two reads; identity must not.
    def ident(found):  # type: ignore[no-untyped-def]
        return [(d.id, d.uuid, d.klass, d.memory_total_mb, d.mig, d.gpu_instance,
                 d.compute_instance, d.profile) for d in found.devices]
    if not by_nvml.devices and not by_smi.devices:
        (out / "discovery.json").write_text(json.dumps(report, indent=2))
        print("neither source saw a device: see the problems above")
        return 2
    agree = ident(by_nvml) == ident(by_smi)
    report["agree"] = agree
    (out / "discovery.json").write_text(json.dumps(report, indent=2))
    print("NVML and nvidia-smi agree on the devices" if agree else
          "NVML and nvidia-smi DISAGREE: see discovery.json")
    return 0 if agree else 1


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
