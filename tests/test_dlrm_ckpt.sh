#!/usr/bin/env bash
# dlrm's save, checkpoint and load paths, as README section 6 gives them, with real processes: a sync
# job (2 servers, 2 workers) whose server rank is SIGKILLed and that is resumed with --load ends with
# the model of an uninterrupted run (the dense network bit for bit, every table row byte for byte),
# with --dense-on-servers too; one process likewise (itself killed); the table the job left loads
# under 1 and 3 servers and in one process (re-partitioned: the same rows, each once); a folder with
# no shards is a clear error; --save to a folder that cannot be made is refused before training;
# --mode sync without a launcher trains in one process, too many servers say what to do; --synthetic
# runs from any folder, two at once each on its own samples; a CRLF line
# of 4096 bytes is read as the same line with LF, 4097 bytes are over-long either way. The pipeline
# (--pipeline) checkpoints inside an epoch and resumes to the uninterrupted model. SIGTERM to one worker of
# a sync job stops every worker after the same step, checkpointed there, and every rank (servers too) exits
# 143 within seconds; --load goes on to the uninterrupted model; the pipeline stops likewise at its next
# checkpoint boundary; SIGINT to one process without --checkpoint: 130, nothing saved.
# Run from the repository root: build/test_dlrm_ckpt.
. tests/script_util.sh dlrm_ckpt
dlrm=$build/dlrm run=$build/pdde-run
[ -x "$dlrm" ] || { echo "SKIP: $dlrm is not built"; finish; exit; }

# 2000 samples (1800 train, 200 held out), ids 0..49 a field: batch 32 = 28 steps an epoch for 2 workers
awk 'BEGIN { srand(7); for (i = 0; i < 2000; i++) { printf "%d", rand() < 0.3; for (j = 0; j < 13; j++) printf "\t%d", int(rand() * 10);
             for (j = 0; j < 26; j++) printf "\t%08x", int(rand() * 50); print "" } }' >"$tmp/data.tsv"
model="--data $tmp/data.tsv --batch 32 --dim 4 --hidden 8"

# The model of two folders the same: their dense.ckpt bit for bit (tensors, step, data position) and
# their table (every shard file, any count of servers) row by row, each id once.
same_model() {
    "$build/pdde-ckpt" diff "$1/dense.ckpt" "$2/dense.ckpt" >"$tmp/diff.out" 2>&1 || { cat "$tmp/diff.out"; return 1; }
    python3 - "$1" "$2" <<'EOF'
import glob, struct, sys
def table(d):  # id -> the row's bytes past its id, the table steps, the rows counted
    rows, steps, n_all = {}, set(), 0
    for p in glob.glob(d + "/ps-shard-*-of-*.bin"):
        b = open(p, "rb").read()
        row_bytes = struct.unpack_from("<I", b, 16)[0]
        step, n = struct.unpack_from("<2q", b, 24)
        steps.add(step); n_all += n
        for i in range(n):
            r = b[40 + i * row_bytes: 40 + (i + 1) * row_bytes]
            rows[r[:8]] = r[8:]
    return rows, steps, n_all
(a, sa, na), (b, sb, nb) = table(sys.argv[1]), table(sys.argv[2])
bad = sum(1 for k in a if b.get(k) != a[k]) + sum(1 for k in b if k not in a)
print(f"table rows {len(a)} / {len(b)} ({na} / {nb} in the files), steps {sorted(sa)} / {sorted(sb)}, {bad} differ")
sys.exit(0 if a and not bad and na == len(a) and nb == len(b) and len(sa) == 1 and sa == sb else 1)
EOF
}

# Starts `$@` in the background (a session of its own, its output in $tmp/killed.out), waits until the
# command $1 succeeds, then sends signal $2 to the session's dlrm whose PDDE_RANK is $3 (none: its dlrm);
# leaves the exit status in $killed_rc and the milliseconds from the signal to the end in $killed_ms.
signal_when() {
    local ready=$1 sig=$2 rank=$3; shift 3
    setsid "$@" >"$tmp/killed.out" 2>&1 &
    local pid=$! victim=
    for _ in $(seq 1 1500); do eval "$ready" && break; sleep 0.01; done
    for c in $(pgrep -s $pid -x dlrm); do
        [ -z "$rank" ] || tr '\0' '\n' <"/proc/$c/environ" 2>/dev/null | grep -qx "PDDE_RANK=$rank" && victim=$c
    done
    local t0=$(date +%s%N)
    [ -n "$victim" ] && kill -"$sig" "$victim"
    { wait $pid; } 2>/dev/null; killed_rc=$?  # (no "Killed" from the shell)
    killed_ms=$((($(date +%s%N) - t0) / 1000000))
}
# The same, SIGKILL once $1's checkpoint folder names a checkpoint.
kill_after_checkpoint() { local ck=$1 rank=$2; shift 2; signal_when "[ -f '$ck/latest' ]" KILL "$rank" "$@"; }
# Each rank of a pdde-run job run by this shell says how it ended (it waits for its program whatever the signal).
printf '#!/usr/bin/env bash\ntrap : TERM INT\n"$@"; rc=$?; echo "rank $PDDE_RANK exit $rc"; exit $rc\n' >"$tmp/exit_note.sh"
chmod +x "$tmp/exit_note.sh"

resumed_at() { sed -nE 's/.*resuming .* at step ([0-9]+) of ([0-9]+)$/\1 \2/p' "$1" | head -1; }

if [ -x "$run" ]; then
    for dense in 0 1; do
        job="$run -n 4 $dlrm --servers 2 --mode sync $model --epochs 40 --dense-on-servers $dense"
        timeout 120 $job --save "$tmp/ref$dense" >"$tmp/ref.out" 2>&1
        check "sync job, dense on servers $dense: the uninterrupted run saves (rc $?)" $?
        kill_after_checkpoint "$tmp/ck$dense" 1 timeout 120 $job --checkpoint "$tmp/ck$dense" --checkpoint-every 30
        [ "$killed_rc" != 0 ] && grep -q 'rank 1 .*killed by signal 9' "$tmp/killed.out"
        check "dense on servers $dense: server rank 1 SIGKILLed after a checkpoint, the job fails (rc $killed_rc)" $?
        name=$(cat "$tmp/ck$dense/latest" 2>/dev/null)
        [ -f "$tmp/ck$dense/$name/dense.ckpt" ] && [ -f "$tmp/ck$dense/$name/ps-shard-0-of-2.bin" ] && [ -f "$tmp/ck$dense/$name/ps-shard-1-of-2.bin" ]
        check "the checkpoint latest names ($name) is whole: dense.ckpt and both shards" $?
        timeout 120 $job --checkpoint "$tmp/ck$dense" --checkpoint-every 30 --load "$tmp/ck$dense" --save "$tmp/out$dense" >"$tmp/resumed.out" 2>&1
        rc=$?
        read -r at total < <(resumed_at "$tmp/resumed.out"; echo)
        [ $rc = 0 ] && [ -n "$at" ] && [ "$at" -gt 0 ] && [ "$at" -lt "$total" ]
        check "--load resumes inside the run (rc $rc, at step '$at' of '$total')" $?
        same_model "$tmp/ref$dense" "$tmp/out$dense" >"$tmp/same.out" 2>&1
        ok=$?
        check "dense on servers $dense: killed and resumed ends with the uninterrupted model ($(tail -1 "$tmp/same.out"))" $ok
        [ "$(cat "$tmp/ck$dense/latest")" = "samples-$((total * 64))" ] && [ "$(ls "$tmp/ck$dense" | grep -c '^samples-')" = 1 ]
        ok=$?
        check "the last checkpoint is the run's end (samples-$((total * 64))), the older ones removed ($(ls "$tmp/ck$dense" | tr '\n' ' '))" $ok
    done
    # the table 2 servers wrote, re-partitioned over 1 and 3 servers (1 worker: every step already done,
    # the evaluation pulls the rows the saved run's evaluation pulled)
    for servers in 1 3; do
        timeout 120 "$run" -n $((servers + 1)) "$dlrm" --servers $servers --mode sync $model --epochs 40 --load "$tmp/ck0" --save "$tmp/to$servers" >"$tmp/to.out" 2>&1
        rc=$?
        [ $rc = 0 ] && [ "$(ls "$tmp/to$servers" | grep -c "^ps-shard-[0-9]-of-$servers.bin$")" = $servers ]
        check "a 2-server checkpoint loads under $servers server(s) (rc $rc)" $?
        same_model "$tmp/ref0" "$tmp/to$servers" >"$tmp/same.out" 2>&1
        ok=$?
        check "2 -> $servers servers: the same model, each row on one server ($(tail -1 "$tmp/same.out"))" $ok
    done
    timeout 120 "$run" -n 4 "$dlrm" --servers 3 --mode sync $model --epochs 40 --load "$tmp/to1" --save "$tmp/to13" >"$tmp/to.out" 2>&1
    rc=$?
    [ $rc = 0 ] && [ -f "$tmp/to13/ps-shard-2-of-3.bin" ]
    check "a 1-server save loads under 3 servers (rc $rc)" $?
    # SIGTERM to worker rank 3 alone, some steps into a sync job of 400 epochs: every worker stops after the same
    # step, the lead checkpoints it (no periodic checkpoints here), every rank exits 143 (servers too) within
    # seconds; --load goes on from that step to the model of a run never stopped
    signal_when "grep -q 'step 101/' '$tmp/killed.out'" TERM 3 timeout 20 "$run" -n 4 "$tmp/exit_note.sh" "$dlrm" --servers 2 --mode sync $model \
        --epochs 400 --checkpoint "$tmp/stop" --checkpoint-every 100000
    n=$(sed -nE "s|^\[2\] dlrm: Terminated: stopped after step ([0-9]+) of 11200, saved a checkpoint in $tmp/stop .*|\1|p" "$tmp/killed.out")
    exits=$(grep -c '^\[\([0-3]\)\] rank \1 exit 143$' "$tmp/killed.out")
    [ "$killed_rc" = 143 ] && [ "$killed_ms" -lt 5000 ] && [ "$exits" = 4 ] && [ -n "$n" ] && [ "$(cat "$tmp/stop/latest")" = "samples-$((n * 64))" ]
    ok=$?
    check "SIGTERM to worker rank 3: stopped after step ${n:-?}, checkpointed there ($(cat "$tmp/stop/latest" 2>/dev/null)), $exits of 4 ranks exit 143 (rc $killed_rc, ${killed_ms} ms)" $ok
    if [ $ok = 0 ]; then
        job="$run -n 4 $dlrm --servers 2 --mode sync $model --epochs $((n / 28 + 2))"
        timeout 20 $job --save "$tmp/stop_ref" >"$tmp/stop_ref.out" 2>&1
        rc=$?
        timeout 20 $job --load "$tmp/stop" --save "$tmp/stop_out" >"$tmp/resumed.out" 2>&1
        rc2=$?
        read -r at total < <(resumed_at "$tmp/resumed.out"; echo)
        same_model "$tmp/stop_ref" "$tmp/stop_out" >"$tmp/same.out" 2>&1 && [ $rc = 0 ] && [ $rc2 = 0 ] && [ "$at" = "$n" ]
        ok=$?
        check "--load of the stop's checkpoint resumes at step ${at:-?} and ends with the model of a run never stopped ($(tail -1 "$tmp/same.out"); rc $rc/$rc2)" $ok
    fi
    mkdir -p "$tmp/empty"
    timeout 60 "$run" -n 3 "$dlrm" --servers 1 --mode sync $model --load "$tmp/empty" >"$tmp/empty.out" 2>&1
    rc=$?
    [ $rc != 0 ] && grep -q "empty holds no table shards" "$tmp/empty.out"
    ok=$?
    check "--load of a folder with no shards says so (rc $rc: $(grep -m1 'shards' "$tmp/empty.out"))" $ok
    timeout 60 "$run" -n 2 "$dlrm" --servers 2 --mode sync $model >"$tmp/few.out" 2>&1
    rc=$?
    [ $rc != 0 ] && grep -q 'start more ranks than --servers (pdde-run -n 3 or more) or pass fewer' "$tmp/few.out"
    check "2 ranks with --servers 2 say what to do (rc $rc)" $?
else echo "SKIP ucx: pdde-run is not built: the server jobs are not run"; fi

# one process: checkpoints too; killed and resumed ends with the uninterrupted model; loads the 2-server table
one="$dlrm $model --epochs 150"
timeout 120 $one --save "$tmp/one_ref" >"$tmp/one.out" 2>&1
check "one process: the uninterrupted run saves (rc $?)" $?
kill_after_checkpoint "$tmp/one_ck" "" timeout 120 $one --checkpoint "$tmp/one_ck" --checkpoint-every 100
name=$(cat "$tmp/one_ck/latest" 2>/dev/null)
[ "$killed_rc" != 0 ] && [ -f "$tmp/one_ck/$name/dense.ckpt" ] && [ -f "$tmp/one_ck/$name/ps-shard-0-of-1.bin" ]
check "one process with --checkpoint writes whole checkpoints ($name; SIGKILLed: rc $killed_rc)" $?
timeout 120 $one --checkpoint "$tmp/one_ck" --checkpoint-every 100 --load "$tmp/one_ck" --save "$tmp/one_out" >"$tmp/resumed.out" 2>&1
rc=$?
read -r at total < <(resumed_at "$tmp/resumed.out"; echo)
[ $rc = 0 ] && [ -n "$at" ] && [ "$at" -gt 0 ] && [ "$at" -lt "$total" ]
check "one process: --load resumes inside the run (rc $rc, at step '$at' of '$total')" $?
same_model "$tmp/one_ref" "$tmp/one_out" >"$tmp/same.out" 2>&1
ok=$?
check "one process: killed and resumed ends with the uninterrupted model ($(tail -1 "$tmp/same.out"))" $ok
# the pipeline (one slot: the same order of pulls and pushes on every run) checkpoints inside an epoch
# (every 30 steps, 56 to an epoch) and resumes to the uninterrupted model
pipe="$dlrm $model --epochs 40 --pipeline 1"
timeout 120 $pipe --save "$tmp/pipe_ref" >"$tmp/pipe.out" 2>&1
check "pipeline: the uninterrupted run saves (rc $?)" $?
kill_after_checkpoint "$tmp/pipe_ck" "" timeout 120 $pipe --checkpoint "$tmp/pipe_ck" --checkpoint-every 30
timeout 120 $pipe --checkpoint "$tmp/pipe_ck" --checkpoint-every 30 --load "$tmp/pipe_ck" --save "$tmp/pipe_out" >"$tmp/resumed.out" 2>&1
rc=$?
read -r at total < <(resumed_at "$tmp/resumed.out"; echo)
[ $rc = 0 ] && [ -n "$at" ] && [ "$at" -gt 0 ] && [ "$at" -lt "$total" ] && [ $((at % 30)) = 0 ] && [ $((at % 56)) != 0 ]
check "pipeline: --load resumes at a checkpoint inside an epoch (rc $rc, at step '$at' of '$total', SIGKILLed: rc $killed_rc)" $?
same_model "$tmp/pipe_ref" "$tmp/pipe_out" >"$tmp/same.out" 2>&1
ok=$?
check "pipeline: killed and resumed ends with the uninterrupted model ($(tail -1 "$tmp/same.out"))" $ok
# SIGTERM to the pipeline: it stops at its next checkpoint boundary (every 30 steps, and each epoch's end: 56 steps), checkpointed
# there, exit 143; --load goes on to the model of a run never stopped
signal_when "grep -q '^epoch 1 (pipelined' '$tmp/killed.out'" TERM "" timeout 20 $pipe --epochs 400 --checkpoint "$tmp/pipe_stop" --checkpoint-every 30
n=$(sed -nE "s|^dlrm: Terminated: stopped after step ([0-9]+) of 22400, saved a checkpoint in $tmp/pipe_stop .*|\1|p" "$tmp/killed.out")
[ "$killed_rc" = 143 ] && [ -n "$n" ] && { [ $((n % 30)) = 0 ] || [ $((n % 56)) = 0 ]; } && [ "$n" -gt 56 ] && [ "$(cat "$tmp/pipe_stop/latest")" = "samples-$((n * 32))" ]
ok=$?
check "pipeline: SIGTERM stops it at a checkpoint boundary (step ${n:-?}, checkpoint $(cat "$tmp/pipe_stop/latest" 2>/dev/null); rc $killed_rc)" $ok
if [ $ok = 0 ]; then
    timeout 20 $pipe --epochs $((n / 56 + 2)) --save "$tmp/pipe_stop_ref" >"$tmp/pipe_stop_ref.out" 2>&1
    rc=$?
    timeout 20 $pipe --epochs $((n / 56 + 2)) --load "$tmp/pipe_stop" --save "$tmp/pipe_stop_out" >"$tmp/resumed.out" 2>&1
    rc2=$?
    read -r at total < <(resumed_at "$tmp/resumed.out"; echo)
    same_model "$tmp/pipe_stop_ref" "$tmp/pipe_stop_out" >"$tmp/same.out" 2>&1 && [ $rc = 0 ] && [ $rc2 = 0 ] && [ "$at" = "$n" ]
    ok=$?
    check "pipeline: --load of the stop's checkpoint resumes at step ${at:-?} and ends with the model of a run never stopped ($(tail -1 "$tmp/same.out"); rc $rc/$rc2)" $ok
fi
# SIGINT to one process without --checkpoint: it stops after a step, saying nothing was saved, exit 130
signal_when "grep -q 'step 101/' '$tmp/killed.out'" INT "" timeout 20 "$dlrm" $model --epochs 400
[ "$killed_rc" = 130 ] && grep -q '^dlrm: Interrupt: stopped after step [0-9]* of 22400 (no --checkpoint: nothing saved)$' "$tmp/killed.out" &&
    ! grep -q '^held out' "$tmp/killed.out"
ok=$?
check "SIGINT to one process without --checkpoint: 130, nothing saved (rc $killed_rc: $(grep -m1 'stopped after' "$tmp/killed.out"))" $ok

if [ -x "$run" ]; then
    timeout 60 "$dlrm" $model --epochs 40 --batch 64 --load "$tmp/ck0" --save "$tmp/to_one" >"$tmp/to.out" 2>&1
    rc=$?
    same_model "$tmp/ref0" "$tmp/to_one" >"$tmp/same.out" 2>&1
    ok=$?
    check "the 2-server checkpoint loads in one process, batch 64 (rc $rc; $(tail -1 "$tmp/same.out"))" $ok
fi

# --save to a folder that cannot be made: refused before training
timeout 60 "$dlrm" $model --save "$tmp/missing/deeper" >"$tmp/nosave.out" 2>&1
rc=$?
[ $rc = 2 ] && grep -q -- "--save $tmp/missing/deeper: No such file or directory" "$tmp/nosave.out" && ! grep -q '^epoch' "$tmp/nosave.out"
check "--save into a missing folder is refused before training (rc $rc)" $?
# --mode sync without a launcher: one process
timeout 60 "$dlrm" --mode sync $model >"$tmp/nolaunch.out" 2>&1
rc=$?
[ $rc = 0 ] && grep -q 'no launcher: one process' "$tmp/nolaunch.out" && grep -q '^held out' "$tmp/nolaunch.out"
check "--mode sync without a launcher trains in one process and says so (rc $rc)" $?

# --synthetic from a folder with no build/ in it, two runs at once of different sizes: each trains on
# its own samples (they are written to a file of the run's own, not one under the working folder)
mkdir -p "$tmp/elsewhere"
dlrm_abs=$(cd "$(dirname "$dlrm")" && pwd)/$(basename "$dlrm")
(cd "$tmp/elsewhere" && { timeout 60 "$dlrm_abs" --synthetic 3000 --vocab 50 --batch 32 --dim 2 --hidden 4 >"$tmp/syn_a.out" 2>&1 &
                           timeout 60 "$dlrm_abs" --synthetic 5000 --batch 32 --dim 2 --hidden 4 >"$tmp/syn_b.out" 2>&1; wait; })
grep -q '^data: synthetic (--vocab 50): 3000 samples' "$tmp/syn_a.out" && grep -q '^held out' "$tmp/syn_a.out" &&
    grep -q '^data: synthetic (--vocab 1000): 5000 samples' "$tmp/syn_b.out" && grep -q '^held out' "$tmp/syn_b.out" &&
    [ -z "$(ls -A "$tmp/elsewhere")" ]
ok=$?
check "--synthetic twice at once outside the repository: each its own samples ($(grep -hm1 -E '^data|dlrm:' "$tmp/syn_a.out" "$tmp/syn_b.out" | tr '\n' ' '))" $ok

# lines of 4096 and 4097 bytes (the first integer padded with zeros), each with LF and CRLF
awk 'BEGIN { for (len = 4096; len <= 4097; len++) for (cr = 0; cr < 2; cr++) for (k = 0; k < 40; k++) {
             line = "\t1"; for (j = 1; j < 13; j++) line = line "\t" j; for (j = 0; j < 26; j++) line = line sprintf("\t%08x", (k + j) % 7);
             pad = ""; while (length(pad) < len - length(line) - 1) pad = pad "0";
             printf "%d\t%s%s%s\n", k % 2, pad, substr(line, 2), cr ? "\r" : "" } }' >"$tmp/long.tsv"
awk '{ sub(/\r$/, ""); n[length($0)]++ } END { exit !(n[4096] == 80 && n[4097] == 80) }' "$tmp/long.tsv"
check "the long-line file has 80 lines of 4096 bytes and 80 of 4097 (40 LF, 40 CRLF each)" $?
timeout 60 "$dlrm" --data "$tmp/long.tsv" --batch 8 --dim 2 --hidden 4 >"$tmp/long.out" 2>&1
rc=$?
grep -q 'long.tsv: 80 samples (80 malformed lines skipped)' "$tmp/long.out"
ok=$?
check "4096-byte lines are read with LF and CRLF, 4097-byte ones skipped with both (rc $rc: $(grep -m1 '^data' "$tmp/long.out"))" $ok
finish
