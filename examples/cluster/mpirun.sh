#!/usr/bin/env bash
# Two ranks of train.strategy allreduce on this machine, started by Open MPI's
# mpirun (Debian: openmpi-bin). Each rank reads OMPI_COMM_WORLD_RANK/_SIZE;
# on one host they meet on loopback at cluster.base_port (2222 unless set).
# Across hosts add --host a,b and, since Open MPI does not say which host is
# rank 0's, --set cluster.rendezvous=a:2222 (with cluster.bind_host and
# cluster.token_file set, as for any server reachable from other machines).
#
# A model with embedding tables (configs/ctr_dlrm.yaml) keeps them on ps
# tasks: RANKS=3 examples/cluster/mpirun.sh configs/ctr_dlrm.yaml
# --set cluster.ps_tasks=1 makes the last rank serve the tables while the
# first two train the dense towers; it exits when rank 0 is done.
#
# Usage: examples/cluster/mpirun.sh [CONFIG] [--set key=value]...
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
config="$root/configs/fashion_mnist_mlp.yaml"
if [ $# -gt 0 ] && [ "${1#--}" = "$1" ]; then config="$1"; shift; fi
ranks="${RANKS:-2}"
# Open MPI refuses to run as root unless told that is meant (containers, CI).
if [ "$(id -u)" -eq 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
exec mpirun -np "$ranks" --oversubscribe --bind-to none \
  "${SHARDWILD:-$root/build/shardwild}" train "$config" \
  --set train.strategy=allreduce --set train.workers=1 "$@"
