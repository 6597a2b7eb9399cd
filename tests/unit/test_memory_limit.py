"""The memory a broker may use, which `global-max-size = -1` takes 1/16 of: a container's
cgroup limit wins over the host's physical memory (before, a broker in a 160 MiB
container sized itself by the host's 24 GiB and was OOM-killed by a flood of messages;
tests/system/test_container_memory.py). The cgroup files here are written in tmp_path the
way the kernel lays them out."""

from __future__ import annotations

from pathlib import Path

from scow.core.model import cgroup_memory_limit

MiB = 1 << 20
V1_UNLIMITED = "9223372036854771712"


def _cgroups(tmp_path: Path, proc: str, files: dict[str, str]) -> tuple[str, str]:
    tmp_path.mkdir(exist_ok=True)
    (tmp_path / "cgroup").write_text(proc)
    for name, value in files.items():
        path = tmp_path / "sys" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(value + "\n")
    return str(tmp_path / "cgroup"), str(tmp_path / "sys")


def test_v1_takes_the_lowest_limit_of_the_group_and_its_parents(tmp_path):
    proc, root = _cgroups(
        tmp_path,
        "12:pids:/docker/abc\n9:memory:/docker/abc\n1:name=systemd:/docker/abc\n",
        {
            "memory/memory.limit_in_bytes": V1_UNLIMITED,
            "memory/docker/memory.limit_in_bytes": str(512 * MiB),
            "memory/docker/abc/memory.limit_in_bytes": str(2048 * MiB),
        },
    )
    assert cgroup_memory_limit(proc, root) == 512 * MiB


def test_v2_reads_memory_max_and_max_means_no_limit(tmp_path):
    proc, root = _cgroups(
        tmp_path,
        "0::/system.slice/scow.service\n",
        {
            "system.slice/memory.max": "max",
            "system.slice/scow.service/memory.max": str(160 * MiB),
        },
    )
    assert cgroup_memory_limit(proc, root) == 160 * MiB
    proc, root = _cgroups(tmp_path / "none", "0::/user.slice\n", {"user.slice/memory.max": "max"})
    assert cgroup_memory_limit(proc, root) is None


def test_no_cgroups_at_all(tmp_path):
    assert cgroup_memory_limit(str(tmp_path / "missing"), str(tmp_path)) is None
