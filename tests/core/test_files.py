"""Input paths are checked before anything opens them: a FIFO, a device, a socket, a directory
where a file belongs, an overlong name or a file over its kind's limit is one InputFileError
naming the flag, the path and what is wrong (never a hang, a runaway read or a traceback)."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from recperf.core.errors import ConfigError, InputFileError
from recperf.core.files import check_input, check_name, check_present, read_input_bytes


def test_a_regular_file_and_a_directory_where_asked_pass(tmp_path: Path) -> None:
    f = tmp_path / "a.toml"
    f.write_text("x = 1\n")
    assert check_input(f, "--config") == f
    assert check_input(tmp_path, "--data", want="dir") == tmp_path
    assert check_input(tmp_path, "--data", want="any") == tmp_path
    link = tmp_path / "link.toml"
    link.symlink_to(f)  # a link is followed to what it names
    assert check_input(link, "--config") == link
    assert read_input_bytes(f, "--config") == b"x = 1\n"


@pytest.mark.parametrize(
    ("make", "want", "what"),
    [
        (lambda p: os.mkfifo(p), "file", "is a FIFO (named pipe), not a regular file"),
        (lambda p: os.mkfifo(p), "any", "is a FIFO (named pipe), not a file or directory"),
        (lambda p: p.mkdir(), "file", "is a directory, not a regular file"),
        (lambda p: p.write_text("x"), "dir", "is a regular file, not a directory"),
        (lambda p: None, "file", "no such file or directory"),
    ],
)  # fmt: skip
def test_anything_else_is_one_line_naming_the_flag_and_path(
    tmp_path: Path, make: object, want: str, what: str
) -> None:
    path = tmp_path / "in"
    make(path)  # type: ignore[operator]
    with pytest.raises(InputFileError) as info:
        check_input(path, "--trace", want=want)  # type: ignore[arg-type]
    assert str(info.value) == f"--trace {path}: {what}"
    assert isinstance(info.value, ConfigError)  # the CLI's one line, exit 2


def test_devices_and_sockets_are_refused_without_reading(tmp_path: Path) -> None:
    with pytest.raises(InputFileError, match=r"^--trace /dev/zero: is a character device, not"):
        check_input("/dev/zero", "--trace")
    sock_path = tmp_path / "s"
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(sock_path))
        with pytest.raises(InputFileError, match="is a socket, not a file or directory"):
            check_input(sock_path, "--data", want="any")


def test_a_file_over_its_limit_names_both_sizes(tmp_path: Path) -> None:
    big = tmp_path / "big.json"
    with big.open("wb") as fh:
        fh.truncate(3 << 20)  # sparse: 3 MiB that take no disk
    assert check_input(big, "--model", max_bytes=4 << 20) == big
    with pytest.raises(InputFileError, match=r"3\.0 MiB is over the 2\.0 MiB limit"):
        check_input(big, "--model", max_bytes=2 << 20)


def test_an_overlong_name_and_a_link_loop_are_one_line(tmp_path: Path) -> None:
    long = tmp_path / ("a" * 300) / "x.csv"
    with pytest.raises(InputFileError, match=r"a path component is 300 bytes, over .* 255$"):
        check_input(long, "--trace")
    with pytest.raises(InputFileError, match="300 bytes"):
        check_name(long, "--out")
    with pytest.raises(InputFileError, match="300 bytes"):
        check_present(long, "--catalog")
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    with pytest.raises(InputFileError, match="too many levels of symbolic links"):
        check_input(loop, "--trace")
    assert len(str(check_name(tmp_path / ("b" * 255), "--out")).split("/")[-1]) == 255


def test_check_present_leaves_a_missing_path_to_the_caller(tmp_path: Path) -> None:
    assert check_present(tmp_path / "nope.csv", "--catalog") == tmp_path / "nope.csv"
    os.mkfifo(tmp_path / "f.csv")
    with pytest.raises(InputFileError, match="FIFO"):
        check_present(tmp_path / "f.csv", "--catalog")
