"""`alpha-mpi train` with a fault injected: `audit_train.py RANK:STEP:ELEMENT:BIT[:persistent|:once] TRAIN-ARGS...`.

The fault hook (alpha_mpi_verify.faults.BitFlip) is passed to train_cmd.run explicitly; with
`:persistent` it flips from STEP on (a core that stays faulty); with `:once` only the first
time each slot of STEP is computed (a retried step no longer meets it). The exit status is train's (98
after sdc-detected)."""

import sys

from alpha_mpi.execution.abort import set_abort_at_exit
from alpha_mpi.tools import train_cmd
from alpha_mpi_verify.faults import BitFlip

fields = sys.argv[1].split(":")
rank, step, element, bit = map(int, fields[:4])
persistent, once = fields[4:] == ["persistent"], fields[4:] == ["once"]
set_abort_at_exit(False)
hook = BitFlip(rank=rank, step=step, element=element, bit=bit, persistent=persistent, once=once)
sys.exit(train_cmd.run(sys.argv[2:], fault_hook=hook))
