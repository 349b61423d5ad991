"""What the server shares with the programs around it, kept outside `serve` so that they need not
import the server: the messages as the executor's types (wire), a client for them (client), the
addresses, configuration files and errors every command reads the same way (addresses,
config_files, errors, server_env), the gate files the server and the offline tools load alike
(gate_files), the agreement statistics the server and a replay count alike (shadow), and the in-line
planning of LOCKSTEP sessions the in-process closed loop repeats (lockstep_planning). Named
`contract` because each is one side of an agreement with `serve` (docs/contract.md is its wire half).
"""
