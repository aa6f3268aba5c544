"""Build the 8-GPU host's nvidia-smi outputs from the real one-GPU H200 recording (../h200/layers/gpu_inventory.json).

An HGX H200 board as nvidia-smi shows it: the recorded GPU's CSV row and `-q -x` <gpu> block, eight times, each
with its own index, minor number, UUID and PCI bus id (the bus ids of an HGX H200 baseboard), and a kernel log
with NVIDIA's Xid 79 ("GPU has fallen off the bus", docs.nvidia.com/deploy/xid-errors) on GPU 5. Run it again
after changing it: `python tests/data/gpu/h200x8/make.py`; the files beside it are its output, committed.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

HERE = Path(__file__).parent
REAL = json.loads((HERE.parent / "h200" / "layers" / "gpu_inventory.json").read_text())
BUSES = ("18", "2A", "3A", "5D", "9A", "AB", "BA", "DB")
BAD = 5  # the GPU whose Xid 79 the kernel log holds


def uuid(index: int) -> str:
    return f"GPU-caedbb52-a7ac-b6fb-867b-b909a3c8cf2{index}"


def bus(index: int) -> str:
    return f"00000000:{BUSES[index]}:00.0"


def main() -> None:
    header, row = REAL["query"]["stdout"].strip().splitlines()
    real_uuid, real_bus = "GPU-caedbb52-a7ac-b6fb-867b-b909a3c8cf20", "00000000:00:06.0"
    rows = [re.sub(r"^0,", f"{i},", row).replace(real_uuid, uuid(i)).replace(real_bus, bus(i)) for i in range(8)]
    (HERE / "query.csv").write_text("\n".join([header, *rows]) + "\n")
    xml = REAL["xml"]["stdout"]
    start, end = xml.index("<gpu id="), xml.rindex("</gpu>") + len("</gpu>")
    block = xml[start:end]
    blocks = []
    for i in range(8):
        one = block.replace(real_uuid, uuid(i)).replace(real_bus, bus(i))
        one = one.replace("<minor_number>0</minor_number>", f"<minor_number>{i}</minor_number>")
        one = one.replace("<bus>0x00</bus>", f"<bus>0x{BUSES[i]}</bus>").replace("<device>0x06</device>",
                                                                                 "<device>0x00</device>")
        blocks.append(one)
    full = xml[:start] + "\n\t".join(blocks) + xml[end:]
    full = full.replace("<attached_gpus>1</attached_gpus>", "<attached_gpus>8</attached_gpus>")
    (HERE / "q.xml").write_text(full)
    (HERE / "apps.csv").write_text(REAL["apps"]["stdout"])
    pci = f"0000:{BUSES[BAD].lower()}:00"
    (HERE / "kernel.log").write_text(
        "[    2.311902] nvidia-nvlink: Nvlink Core is being initialized, major device number 508\n"
        "[    2.618830] NVRM: loading NVIDIA UNIX x86_64 Kernel Module  580.159.04\n"
        f"[ 8123.402110] NVRM: GPU at PCI:{pci}: {uuid(BAD)}\n"
        f"[ 8123.402116] NVRM: Xid (PCI:{pci}): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the "
        "bus.\n"
        f"[ 8123.402120] NVRM: GPU {pci}.0: GPU has fallen off the bus.\n")


if __name__ == "__main__":
    main()
