"""config/output_paths.py: whether a run's output paths can be written, on the real file system."""

from __future__ import annotations

from pathlib import Path

from pytest_dflash.config.output_paths import cannot_write


def test_a_folder_that_can_be_made_is_made_and_left_clean(tmp_path: Path) -> None:
    target = tmp_path / "a" / "b"
    assert cannot_write(target, "dir") is None
    assert target.is_dir() and list(target.iterdir()) == []  # the scratch file is gone
    assert cannot_write(tmp_path / "c" / "report.html", "file") is None


def test_a_path_under_a_file_or_in_proc_is_named(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    assert cannot_write(tmp_path / "f" / "out.xml", "file") == f"{tmp_path / 'f'} is a file, not a folder"
    assert (cannot_write(Path("/proc/dflash-nope"), "dir") or "").startswith("No such file or directory")


def test_a_file_path_that_is_a_folder_is_refused(tmp_path: Path) -> None:
    assert cannot_write(tmp_path, "file") == "it is a folder"
