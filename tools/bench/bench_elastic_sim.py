#!/usr/bin/env python3
"""bench_elastic_sim.py - a long job on 16,384 devices replayed with failures, elastic (pdde's in-process
recovery, at the costs bench_elastic measured) against checkpoint-restart every N minutes (the interval
from Young's formula, sqrt(2 x checkpoint write time x mean time between failures), unless given).

Failures arrive as a Poisson process: Llama 3's observed rate (466 interruptions in 54 days on 16,384
GPUs) and one a minute. Per failure:
  elastic:  detect + recover + (lost_steps + 0.5) steps, plus the snapshot overhead on every step; the
            lost host (8 devices) is out for repair_h hours (the job runs on the others, at their
            share of the throughput) and rejoins at a step boundary (one more recover)
  restart:  the work since the last checkpoint, plus restart_s (relaunch, rendezvous, load); every
            checkpoint blocks the job for ckpt_s
ETTR (effective training time ratio) = failure-free time of the work done / wall time. A job fails when
a second interruption lands while it is recovering from the first (the window: recover_s for elastic,
restart_s for a restart); failed_jobs_reduction_pct compares the fraction of day-long jobs that see such
a double failure. Medians over seeds. Last line:
  RESULT elastic_sim ettr_pct=.. ettr_restart_pct=.. failed_jobs_reduction_pct=.. (Llama 3's rate), then
  the same at one failure a minute as ettr_1min_pct / ettr_restart_1min_pct.

usage: bench_elastic_sim.py [--detect S] [--recover S] [--lost-steps N] [--snapshot-pct P] [--step S]
                            [--restart S] [--ckpt S] [--interval-min M] [--repair-h H] [--seeds N]
The defaults are bench_elastic's medians (tools/bench/RESULTS.md); --step is the step time at scale.
"""
import argparse
import math
import random
import statistics

DEVICES, PER_HOST = 16384, 8
DAYS = 54
LLAMA_RATE = 466 / (DAYS * 86400.0)  # interruptions per second, the whole job


def sim_elastic(rate, a, rng, work_s):
    """Wall time to finish work_s seconds of failure-free work, elastic."""
    t, done, out_until = 0.0, 0.0, []  # out_until: repair end times of hosts out
    speed_full = 1.0 / (1.0 + a.snapshot_pct / 100.0)
    next_fail = rng.expovariate(rate)
    per_failure = a.detect + a.recover + (a.lost_steps + 0.5) * a.step
    while done < work_s:
        out_until = [x for x in out_until if x > t]
        hosts = DEVICES // PER_HOST
        speed = speed_full * (hosts - len(out_until)) / hosts
        # run until the next failure or the next rejoin or the end
        nxt = min([next_fail] + out_until)
        need = (work_s - done) / speed
        if t + need <= nxt:
            return t + need
        done += (nxt - t) * speed
        t = nxt
        if nxt == next_fail:
            t += per_failure  # (the lost steps are redone within it)
            out_until.append(t + a.repair_h * 3600)
            next_fail = t + rng.expovariate(rate)
        else:
            t += a.recover  # the repaired host rejoins at a step boundary
            out_until.remove(nxt)
    return t


def sim_restart(rate, a, rng, work_s, interval):
    t, done, since_ckpt = 0.0, 0.0, 0.0
    next_fail = rng.expovariate(rate)
    while done < work_s:
        # the next event: a checkpoint, the end, or a failure
        to_ckpt = interval - since_ckpt
        to_end = work_s - done
        step = min(to_ckpt, to_end)
        if t + step <= next_fail:
            t += step
            done += step
            since_ckpt += step
            if since_ckpt >= interval and done < work_s:
                t += a.ckpt
                since_ckpt = 0.0
            continue
        # the work since the last checkpoint (and up to the failure) is lost
        t = next_fail + a.restart
        done -= since_ckpt
        since_ckpt = 0.0
        next_fail = t + rng.expovariate(rate)
    return t


def double_failure_fraction(rate, window, rng, jobs=20000, day=86400.0):
    """Fraction of day-long jobs in which a failure lands within `window` after another."""
    failed = 0
    for _ in range(jobs):
        t, last = rng.expovariate(rate), None
        while t < day:
            if last is not None and t - last < window:
                failed += 1
                break
            last = t
            t += rng.expovariate(rate)
    return failed / jobs


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--detect", type=float, default=0.067)
    p.add_argument("--recover", type=float, default=0.366)
    p.add_argument("--lost-steps", type=float, default=0)
    p.add_argument("--snapshot-pct", type=float, default=1.88)
    p.add_argument("--step", type=float, default=6.0, help="seconds per training step at scale")
    p.add_argument("--restart", type=float, default=600.0, help="seconds a checkpoint-restart takes")
    p.add_argument("--ckpt", type=float, default=60.0, help="seconds a checkpoint blocks the job")
    p.add_argument("--interval-min", type=float, default=0, help="checkpoint interval (0: Young's formula)")
    p.add_argument("--repair-h", type=float, default=2.0)
    p.add_argument("--seeds", type=int, default=5)
    a = p.parse_args()
    print(f"a {DAYS}-day job on {DEVICES} devices; elastic: detect {a.detect} s, recover {a.recover} s, lost {a.lost_steps} "
          f"steps (+0.5 in progress) of {a.step} s, snapshot overhead {a.snapshot_pct}%, a host out {a.repair_h} h; restart: "
          f"{a.restart} s per restart, {a.ckpt} s per checkpoint")
    results = {}
    for name, rate, days in (("llama3", LLAMA_RATE, DAYS), ("1min", 1 / 60.0, 1)):
        w = days * 86400.0
        interval = a.interval_min * 60 if a.interval_min > 0 else math.sqrt(2 * a.ckpt / rate)
        e, r = [], []
        for seed in range(a.seeds):
            e.append(w / sim_elastic(rate, a, random.Random(seed), w))
            r.append(w / sim_restart(rate, a, random.Random(1000 + seed), w, interval))
        results[name] = (100 * statistics.median(e), 100 * statistics.median(r), interval)
        print(f"{name}: one failure every {1 / rate / 60:.1f} min; ETTR elastic {results[name][0]:.3f}%, checkpoint-restart every "
              f"{interval / 60:.1f} min {results[name][1]:.3f}% ({days} days simulated, median of {a.seeds} seeds)")
    rng = random.Random(7)
    fe = double_failure_fraction(LLAMA_RATE, a.recover + a.detect, rng)
    fr = double_failure_fraction(LLAMA_RATE, a.restart, rng)
    red = 100 * (1 - fe / fr) if fr > 0 else 0.0
    print(f"day-long jobs with a failure during recovery: elastic {100 * fe:.3f}%, restart {100 * fr:.3f}% at Llama 3's rate")
    print(f"RESULT elastic_sim ettr_pct={results['llama3'][0]:.2f} ettr_restart_pct={results['llama3'][1]:.2f} "
          f"failed_jobs_reduction_pct={red:.1f} ettr_1min_pct={results['1min'][0]:.2f} ettr_restart_1min_pct={results['1min'][1]:.2f}")


if __name__ == "__main__":
    main()
