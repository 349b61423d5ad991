"""How the training recipe transfers to datasets it never saw: `dualloop eval-logs` and its
leave-one-dataset-out evaluation."""
