"""Shared-memory names, permissions, unlinking and crash reclaim, on the real /dev/shm."""

from __future__ import annotations

import multiprocessing
import multiprocessing.synchronize
import os
import signal
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ipc.ring import RingNames, create_ring, unlink_ring
from ipc.shm import (
    Permissions,
    SharedSegment,
    ShmNames,
    create_semaphore,
    instance_id,
    list_objects,
    open_semaphore,
    process_alive,
    process_start_ticks,
    reclaim,
    semaphore_path,
    shm_path,
    unlink_semaphore,
)
from ipc.state_page import StatePage
from ipc.wakeup import Doorbell

FORK = multiprocessing.get_context("fork")


@pytest.fixture
def names(tmp_path: Path) -> Iterator[ShmNames]:
    names = ShmNames.for_data_dir(tmp_path)
    yield names
    reclaim(names.instance)


@pytest.fixture
def umask_zero() -> Iterator[None]:
    """A permissive umask: created objects must still be exactly 0600/0660."""
    previous = os.umask(0)
    yield
    os.umask(previous)


def mode_of(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


# -- names --------------------------------------------------------------------------------------------------


def test_two_data_dirs_give_two_instances_and_one_dir_always_the_same(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "a")
    first, second = instance_id(tmp_path / "a"), instance_id(tmp_path / "b")
    assert first != second
    assert instance_id(tmp_path / "a") == first == instance_id(tmp_path / "link")  # the real path counts
    ring_a = ShmNames(first).ring("orders", 0, 1)
    ring_b = ShmNames(second).ring("orders", 0, 1)
    assert ring_a != ring_b and ring_a.startswith(f"/la-{first}-") and ring_b.startswith(f"/la-{second}-")


_topics = st.text(alphabet="abz09._-", min_size=1, max_size=12)
_objects = st.tuples(
    st.sampled_from(["ring", "space", "wake", "state"]), _topics, st.integers(0, 99), st.integers(0, 99)
)


def name_of(names: ShmNames, kind: str, topic: str, partition: int, producer: int) -> str:
    if kind == "ring":
        return names.ring(topic, partition, producer)
    if kind == "space":
        return names.space_semaphore(topic, partition, producer)
    if kind == "wake":
        return names.doorbell(topic, partition)
    return names.state_page(topic, partition)


@settings(max_examples=200)
@given(
    objects=st.lists(
        _objects, min_size=2, max_size=30, unique_by=lambda o: o if o[0] in ("ring", "space") else o[:3]
    )
)
def test_distinct_objects_get_distinct_names(objects: list[tuple[str, str, int, int]]) -> None:
    names = ShmNames("0123456789abcdef")
    made = [name_of(names, *obj) for obj in objects]
    assert len(set(made)) == len(made)
    for name in made:
        assert name.startswith(names.prefix) and "/" not in name[1:]


def test_long_topics_are_shortened_with_a_hash_and_stay_distinct() -> None:
    names = ShmNames("0123456789abcdef")
    long_a, long_b = "a" * 249, "a" * 248 + "b"
    ring_a, ring_b = names.ring(long_a, 0, 0), names.space_semaphore(long_b, 0, 0)
    assert ring_a != names.ring(long_b, 0, 0)
    assert len("sem." + ring_b.lstrip("/")) <= 255 and "~" in ring_a


@pytest.mark.parametrize("topic", ["", "a/b", "x y", "../up", "tópico", "a\x00b"])
def test_topic_names_that_cannot_be_in_a_name_are_refused(topic: str) -> None:
    with pytest.raises(ValueError, match="topic name"):
        ShmNames("0123456789abcdef").ring(topic, 0, 0)


@pytest.mark.parametrize("bad", ["", "xyz", "0123456789ABCDEF", "0123456789abcdef0"])
def test_instance_ids_are_checked(bad: str) -> None:
    with pytest.raises(ValueError, match="instance id"):
        ShmNames(bad)


def test_negative_partition_or_producer_is_refused() -> None:
    names = ShmNames("0123456789abcdef")
    with pytest.raises(ValueError, match="partition -1"):
        names.doorbell("t", -1)
    with pytest.raises(ValueError, match="producer id -2"):
        names.ring("t", 0, -2)


# -- permissions --------------------------------------------------------------------------------------------


@pytest.mark.usefixtures("umask_zero")
def test_objects_are_created_owner_only(names: ShmNames) -> None:
    ring = RingNames.for_producer(names, "orders", 0, 7)
    doorbell = Doorbell.create(ring.doorbell)
    create_ring(ring, capacity_bytes=4096, ack_slots=4)
    page = StatePage.create(names.state_page("orders", 0))
    for path in (shm_path(ring.ring), semaphore_path(ring.space), semaphore_path(ring.doorbell),
                 shm_path(page.name)):  # fmt: skip
        assert mode_of(path) == 0o600, path
        assert os.stat(path).st_uid == os.getuid()
    page.close()
    doorbell.close()


def test_group_permissions_give_0660_and_the_group(names: ShmNames) -> None:
    gid = 65534 if os.getuid() == 0 else os.getgid()  # root may hand objects to any group ("nogroup")
    previous = os.umask(0o077)  # a strict umask must not narrow the configured mode
    try:
        segment = SharedSegment.create(names.state_page("t", 0), 4096, Permissions.for_group(gid))
        semaphore = create_semaphore(names.doorbell("t", 0), Permissions.for_group(gid))
    finally:
        os.umask(previous)
    for path in (shm_path(segment.name), semaphore_path(semaphore.name)):
        assert mode_of(path) == 0o660
        assert os.stat(path).st_gid == gid
    segment.close()
    semaphore.close()


@pytest.mark.parametrize("mode", [0o644, 0o666, 0o700, 0o4600])
def test_only_owner_and_group_read_write_modes_are_allowed(mode: int) -> None:
    with pytest.raises(ValueError, match="only owner/group"):
        Permissions(mode=mode)


def test_creation_is_exclusive_and_opening_needs_an_existing_object(names: ShmNames) -> None:
    name = names.state_page("t", 0)
    SharedSegment.create(name, 4096).close()
    with pytest.raises(FileExistsError, match=f"shared memory {name} already exists"):
        SharedSegment.create(name, 4096)
    create_semaphore(names.doorbell("t", 0)).close()
    with pytest.raises(FileExistsError, match="already exists"):
        create_semaphore(names.doorbell("t", 0))
    with pytest.raises(FileNotFoundError, match="does not exist"):
        SharedSegment.open(names.state_page("t", 1))
    with pytest.raises(FileNotFoundError, match="does not exist"):
        open_semaphore(names.doorbell("t", 1))
    with pytest.raises(ValueError, match="size 0"):
        SharedSegment.create(names.state_page("t", 2), 0)


# -- lifetime -----------------------------------------------------------------------------------------------


def test_unlink_removes_the_names_and_mappings_survive(names: ShmNames) -> None:
    ring = RingNames.for_producer(names, "orders", 0, 1)
    create_ring(ring, capacity_bytes=4096, ack_slots=4)
    segment = SharedSegment.open(ring.ring)
    unlink_ring(ring)
    assert not shm_path(ring.ring).exists() and not semaphore_path(ring.space).exists()
    segment.buf[4096] = 42  # the mapping still works after the name is gone
    assert segment.buf[4096] == 42
    segment.close()
    assert segment.closed
    segment.close()  # twice is fine
    unlink_ring(ring)  # and so is unlinking what is gone
    assert not unlink_semaphore(ring.space)
    assert list_objects(names.instance) == ([], [])


def test_state_page_and_doorbell_unlink_on_clean_shutdown(names: ShmNames) -> None:
    page = StatePage.create(names.state_page("t", 0))
    doorbell = Doorbell.create(names.doorbell("t", 0))
    assert list_objects(names.instance) == ([page.name], [doorbell.name])
    page.close()
    page.unlink()
    doorbell.close()
    doorbell.unlink()
    assert list_objects(names.instance) == ([], [])


def _create_then_hang(instance: str, ready: multiprocessing.synchronize.Event) -> None:
    names = ShmNames(instance)
    for producer in range(3):
        create_ring(RingNames.for_producer(names, "orders", 0, producer), capacity_bytes=4096, ack_slots=4)
    Doorbell.create(names.doorbell("orders", 0))
    StatePage.create(names.state_page("orders", 0))
    ready.set()
    signal.pause()


def test_reclaim_removes_what_a_sigkilled_owner_left_and_nothing_of_other_instances(tmp_path: Path) -> None:
    crashed = ShmNames.for_data_dir(tmp_path / "crashed")
    neighbour = ShmNames.for_data_dir(tmp_path / "neighbour")
    neighbour_page = StatePage.create(neighbour.state_page("orders", 0))
    neighbour_bell = Doorbell.create(neighbour.doorbell("orders", 0))
    ready = FORK.Event()
    owner = FORK.Process(target=_create_then_hang, args=(crashed.instance, ready))
    owner.start()
    try:
        assert ready.wait(20)
        os.kill(owner.pid or 0, signal.SIGKILL)
        owner.join()
        assert owner.exitcode == -signal.SIGKILL
        segments, semaphores = list_objects(crashed.instance)
        assert len(segments) == 4 and len(semaphores) == 4  # 3 rings + state page; 3 spaces + doorbell
        removed = reclaim(crashed.instance)
        assert sorted(removed) == sorted(segments + semaphores)
        assert list_objects(crashed.instance) == ([], [])
        assert not any(p.name.startswith(f"la-{crashed.instance}") for p in Path("/dev/shm").iterdir())
        assert list_objects(neighbour.instance) == ([neighbour_page.name], [neighbour_bell.name])
        assert reclaim(crashed.instance) == []
    finally:
        if owner.is_alive():
            owner.kill()
            owner.join()
        neighbour_page.close()
        neighbour_bell.close()
        reclaim(neighbour.instance)
        reclaim(crashed.instance)


# -- process liveness ---------------------------------------------------------------------------------------


def test_process_alive_tells_running_dead_zombie_and_reused_pids_apart() -> None:
    me = os.getpid()
    ticks = process_start_ticks(me)
    assert ticks is not None and process_alive(me) and process_alive(me, ticks)
    assert not process_alive(me, ticks + 1)  # same pid, another process (reused pid)
    child = FORK.Process(target=signal.pause)
    child.start()
    assert child.pid is not None and process_alive(child.pid)
    os.kill(child.pid, signal.SIGKILL)
    while process_alive(child.pid):  # a zombie until reaped: already counts as dead
        os.sched_yield()
    child.join()
    assert not process_alive(child.pid) and process_start_ticks(child.pid) is None
    assert not process_alive(0) and not process_alive(-5)
