"""proton's C examples (`send`, `receive`), built once from Debian's
libqpid-proton11-dev-examples sources.

The sources live in /usr/share/proton/examples/c; `receive HOST PORT ADDRESS COUNT` prints
each message's body (pn_inspect) before it accepts it, so its stdout, line-buffered, lists
at least every message it acknowledged. COUNT 0 receives forever.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

EXAMPLES = Path("/usr/share/proton/examples/c")
#: Debian's split libraries first (proton >= 0.38 ships them), then the one library 0.37 has.
PKG_CONFIG_NAMES = (("libqpid-proton-proactor", "libqpid-proton-core"), ("libqpid-proton",))
PACKAGES = "libqpid-proton11-dev-examples libqpid-proton11-dev"


@dataclass(frozen=True)
class CExamples:
    send: Path
    receive: Path
    #: `stdbuf -oL` when available: receive's printf lines reach a file before it acks.
    line_buffered: tuple[str, ...]

    def receive_command(self, port: int, address: str, count: int = 0) -> list[str]:
        return [*self.line_buffered, str(self.receive), "127.0.0.1", str(port), address, str(count)]

    def send_command(self, port: int, address: str, count: int) -> list[str]:
        return [str(self.send), "127.0.0.1", str(port), address, str(count)]


def _flags() -> list[str] | str:
    """The compiler and linker flags from pkg-config, or why there are none."""
    if shutil.which("pkg-config") is None:
        return "pkg-config is not installed"
    for names in PKG_CONFIG_NAMES:
        result = subprocess.run(
            ["pkg-config", "--cflags", "--libs", *names], capture_output=True, text=True
        )
        if result.returncode == 0:
            return result.stdout.split()
    return f"pkg-config knows none of {PKG_CONFIG_NAMES} (install {PACKAGES})"


def build(cache: Path) -> CExamples | str:
    """Compile send.c and receive.c into `cache` (reused when present); a reason if not."""
    if not (EXAMPLES / "receive.c").exists():
        return f"{EXAMPLES}/receive.c is missing: install {PACKAGES}"
    if shutil.which("gcc") is None:
        return "gcc is not installed"
    built = {}
    for name in ("send", "receive"):
        binary = cache / f"c-{name}"
        if not binary.exists():
            flags = _flags()
            if isinstance(flags, str):
                return flags
            cache.mkdir(parents=True, exist_ok=True)
            result = subprocess.run(
                ["gcc", "-O1", str(EXAMPLES / f"{name}.c"), "-o", str(binary), *flags],
                capture_output=True,
                text=True,
            )
            if result.returncode != 0:
                return f"gcc {name}.c failed:\n{result.stderr[-2000:]}"
        built[name] = binary
    stdbuf = shutil.which("stdbuf")
    return CExamples(built["send"], built["receive"], (stdbuf, "-oL") if stdbuf else ())


def printed_bodies(path: Path) -> list[str]:
    """The string bodies `receive` printed (`"id"` lines), in order."""
    if not path.exists():
        return []
    text = path.read_text(errors="replace")
    lines = text.splitlines() if text.endswith("\n") else text.splitlines()[:-1]
    return [line[1:-1] for line in lines if len(line) >= 2 and line[0] == line[-1] == '"']
