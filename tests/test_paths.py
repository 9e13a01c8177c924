"""PathReceiver: when each kind of datagram is acked, and what the ack says; PathSender:
what a late ack means."""

from __future__ import annotations

from wangate.core.estimator import PathEstimator
from wangate.core.frames import MAX_ACK_RANGES, Ack
from wangate.core.paths import (
    ACK_EVERY_DATAGRAMS,
    CRITICAL_ACK_DELAY_S,
    MAX_ACK_DELAY_S,
    MIN_RTO_S,
    PathReceiver,
    PathSender,
    SentDatagram,
)


def test_bulk_is_acked_within_the_max_ack_delay_of_the_first_pending() -> None:
    receiver = PathReceiver()
    receiver.on_datagram(1, 1_000, now=10.0, ack_within_s=MAX_ACK_DELAY_S)
    receiver.on_datagram(2, 2_000, now=10.002, ack_within_s=MAX_ACK_DELAY_S)
    assert receiver.ack_deadline() == 10.0 + MAX_ACK_DELAY_S
    assert receiver.take_ack(10.004) is None
    assert receiver.take_ack(10.0 + MAX_ACK_DELAY_S) == Ack(2_000, 3_000, ((1, 2),))
    assert receiver.ack_deadline() is None
    assert receiver.take_ack(11.0) is None


def test_critical_data_brings_the_ack_forward_to_its_own_short_delay() -> None:
    receiver = PathReceiver()
    receiver.on_datagram(1, 1_000, now=10.0, ack_within_s=MAX_ACK_DELAY_S)
    receiver.on_datagram(2, 2_000, now=10.001, ack_within_s=CRITICAL_ACK_DELAY_S)
    receiver.on_datagram(3, 3_000, now=10.0015, ack_within_s=CRITICAL_ACK_DELAY_S)
    assert receiver.ack_deadline() == 10.001 + CRITICAL_ACK_DELAY_S
    # one ack covers every critical datagram of the last millisecond
    assert receiver.take_ack(10.002) == Ack(3_000, 500, ((1, 3),))
    receiver.on_datagram(4, 4_000, now=10.003, ack_within_s=MAX_ACK_DELAY_S)
    assert receiver.ack_deadline() == 10.003 + MAX_ACK_DELAY_S


def test_a_probe_is_acked_at_once() -> None:
    receiver = PathReceiver()
    receiver.on_datagram(7, 7_000, now=3.0, ack_within_s=MAX_ACK_DELAY_S)
    receiver.on_datagram(9, 9_000, now=3.001, ack_within_s=0.0)
    assert receiver.ack_deadline() == 3.001
    assert receiver.take_ack(3.001) == Ack(9_000, 0, ((7, 7), (9, 9)))


def test_a_full_batch_is_acked_without_waiting() -> None:
    receiver = PathReceiver()
    for seq in range(ACK_EVERY_DATAGRAMS):
        receiver.on_datagram(seq, seq, now=1.0 + seq * 1e-5, ack_within_s=MAX_ACK_DELAY_S)
    assert receiver.ack_deadline() == 1.0
    ack = receiver.take_ack(1.0004)
    assert ack is not None
    assert ack.ranges == ((0, ACK_EVERY_DATAGRAMS - 1),)


def test_ranges_beyond_one_ack_stay_pending_and_are_due_at_once() -> None:
    receiver = PathReceiver()
    count = MAX_ACK_RANGES + 3
    for i in range(count):  # every other sequence number: one range each
        receiver.on_datagram(2 * i, i, now=5.0, ack_within_s=MAX_ACK_DELAY_S)
    first = receiver.take_ack(5.0 + MAX_ACK_DELAY_S)
    assert first is not None
    assert first.ranges == tuple((2 * i, 2 * i) for i in range(3, count))
    assert receiver.pending_count == 3
    assert receiver.ack_deadline() == 5.0 + MAX_ACK_DELAY_S  # still overdue
    second = receiver.take_ack(5.0 + MAX_ACK_DELAY_S)
    assert second is not None
    assert second.ranges == ((0, 0), (2, 2), (4, 4))
    assert receiver.ack_deadline() is None


def _lost_datagram() -> tuple[PathSender, int]:
    sender = PathSender("a", 1200, PathEstimator())
    seq = sender.record(SentDatagram(1, 0, 100, sent_at=1.0, size_bytes=100))
    assert [d.msg_id for d in sender.detect_lost(now=1.9)] == [1]  # its timer ran out
    return sender, seq


def test_a_late_ack_is_a_spurious_loss_that_raises_the_loss_timer_floor() -> None:
    sender, seq = _lost_datagram()
    acked, late = sender.acknowledge(Ack(0, 0, ((seq, seq),)), now=2.0)
    assert (acked, [d.msg_id for d in late]) == ([], [1])
    assert sender.spurious_losses == 1
    assert sender.rto_floor_s == 1.0  # 1.25 x its 1 s lateness, at most RTO_FLOOR_MAX_S


def test_an_ack_that_waited_out_an_outage_is_not_taken_for_reordering() -> None:
    sender, seq = _lost_datagram()
    sender.back_at = 1.95  # the path was declared down, then heard again
    acked, late = sender.acknowledge(Ack(0, 0, ((seq, seq),)), now=2.0)
    assert (acked, [d.msg_id for d in late]) == ([], [1])
    assert sender.spurious_losses == 0
    assert sender.rto_floor_s == MIN_RTO_S


def test_a_timeout_declares_the_two_oldest_lost_and_doubles_until_an_ack() -> None:
    sender = PathSender("a", 1200, PathEstimator())
    for i in range(10):
        sender.record(SentDatagram(1, i * 100, i * 100 + 100, sent_at=1.0, size_bytes=100))
    rto_s = sender.retransmission_timeout_s()
    assert sender.loss_deadline() == 1.0 + rto_s
    assert sender.detect_lost(1.0 + rto_s - 1e-6) == []
    fired_at = 1.0 + rto_s
    assert [d.start for d in sender.detect_lost(fired_at)] == [0, 100]
    assert sender.loss_deadline() == fired_at + 2 * rto_s  # the rest may yet be acked
    assert sender.detect_lost(fired_at + 2 * rto_s - 1e-6) == []
    assert [d.start for d in sender.detect_lost(fired_at + 2 * rto_s)] == [200, 300]
    assert sender.rto_backoff == 4
    # the first repair's ack: the timeout is itself again, and the thresholds say the
    # rest: all sent before the acked datagram, and long enough before
    repair = sender.record(SentDatagram(1, 0, 100, sent_at=fired_at + 0.1, size_bytes=100))
    acked, _ = sender.acknowledge(Ack(0, 0, ((repair, repair),)), now=fired_at + 0.2)
    assert len(acked) == 1 and sender.rto_backoff == 1
    assert [d.start for d in sender.detect_lost(fired_at + 0.2)] == [400, 500, 600, 700, 800, 900]


def test_with_another_path_open_a_timeout_declares_everything_past_it_lost() -> None:
    # the repairs go where acks still come, and the run of losses marks the path degraded
    sender = PathSender("a", 1200, PathEstimator())
    for i in range(10):
        sender.record(
            SentDatagram(1, i * 100, i * 100 + 100, sent_at=1.0 + i * 0.01, size_bytes=100)
        )
    rto_s = sender.retransmission_timeout_s()
    lost = sender.detect_lost(1.05 + rto_s, alone=False)
    assert [d.start for d in lost] == [0, 100, 200, 300, 400, 500]  # sent at 1.0-1.05
    assert sender.rto_backoff == 1


def test_a_timeout_declares_only_datagrams_past_it() -> None:
    # an idle path's probes, 0.1 s apart: the first one's timeout says nothing of the next
    sender = PathSender("a", 1200, PathEstimator())
    sender.record(SentDatagram(0, 0, 0, sent_at=1.0, size_bytes=40))
    sender.record(SentDatagram(0, 0, 0, sent_at=1.1, size_bytes=40))
    fired_at = 1.0 + sender.retransmission_timeout_s()
    assert fired_at < 1.1 + sender.retransmission_timeout_s()
    assert [d.sent_at for d in sender.detect_lost(fired_at)] == [1.0]
