"""loopstack: the command line that ties serving, memory, agents and benchmarks together."""
