"""`alpha-mpi train` with a fault injected: `audit_train.py RANK:STEP:ELEMENT:BIT TRAIN-ARGS...`.

The fault hook (alpha_mpi_verify.faults.BitFlip) is passed to train_cmd.run explicitly; the exit
status is train's (98 after sdc-detected)."""

import sys

from alpha_mpi.execution.abort import set_abort_at_exit
from alpha_mpi.tools import train_cmd
from alpha_mpi_verify.faults import BitFlip

rank, step, element, bit = map(int, sys.argv[1].split(":"))
set_abort_at_exit(False)
sys.exit(train_cmd.run(sys.argv[2:], fault_hook=BitFlip(rank=rank, step=step, element=element, bit=bit)))
