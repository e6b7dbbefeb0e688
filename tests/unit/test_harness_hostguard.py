"""The workspace root: made private, never through a link another user planted (issue 37, 8)."""

from __future__ import annotations

import os

import pytest

from gyre.harness.hostguard import HostSetupError, private_dir

as_root = pytest.mark.skipif(os.geteuid() != 0, reason="planting another user's link needs root")
OTHER = 65534


def test_made_private_and_an_open_one_of_ours_closed(tmp_path):
    private_dir(tmp_path / "a" / "ws")
    assert os.stat(tmp_path / "a" / "ws").st_mode & 0o777 == 0o700
    (tmp_path / "open").mkdir(mode=0o755)
    os.chmod(tmp_path / "open", 0o755)
    private_dir(tmp_path / "open")
    assert os.stat(tmp_path / "open").st_mode & 0o777 == 0o700


@as_root
def test_a_link_planted_by_another_user_is_refused_and_its_target_untouched(tmp_path):
    """/tmp/gyre-executions planted as a link to a folder of the launcher's (say /etc): its
    target was chmod'ed 0700 and used for the workspaces."""
    sticky = tmp_path / "tmp"
    sticky.mkdir()
    os.chmod(sticky, 0o1777)
    target = tmp_path / "etc"
    target.mkdir()
    os.chmod(target, 0o755)
    link = sticky / "gyre-executions"
    link.symlink_to(target)
    os.lchown(link, OTHER, OTHER)
    with pytest.raises(HostSetupError, match="is a link"):
        private_dir(link)
    assert os.stat(target).st_mode & 0o777 == 0o755
    assert list(target.iterdir()) == []


@as_root
def test_a_path_through_another_users_link_is_refused(tmp_path):
    target = tmp_path / "theirs"
    (target / "ws").mkdir(parents=True)
    os.chmod(target / "ws", 0o755)
    link = tmp_path / "planted"
    link.symlink_to(target)
    os.lchown(link, OTHER, OTHER)
    with pytest.raises(HostSetupError, match=f"link owned by uid {OTHER}"):
        private_dir(link / "ws")
    assert os.stat(target / "ws").st_mode & 0o777 == 0o755


def test_a_path_through_a_link_of_our_own_is_followed(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "mine").symlink_to(tmp_path / "real")
    private_dir(tmp_path / "mine" / "ws")
    assert os.stat(tmp_path / "real" / "ws").st_mode & 0o777 == 0o700


def test_a_folder_of_another_user_is_refused(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root to give a folder away")
    (tmp_path / "theirs").mkdir()
    os.chown(tmp_path / "theirs", OTHER, OTHER)
    with pytest.raises(HostSetupError, match=f"belongs to uid {OTHER}"):
        private_dir(tmp_path / "theirs")
