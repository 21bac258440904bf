#!/usr/bin/env bash
# A one-node Slurm on this machine, for the srun tests (tests/dist/dist_srun.sh) in CI:
#   scripts/local-slurm.sh        install (as root, from Debian) and start munge, slurmctld, slurmd
# Idempotent: what is installed or running is left alone. It writes /etc/slurm/slurm.conf only
# when there is none, so it never touches a real cluster's configuration. It never fails the
# caller: without root or when a daemon does not start it says why, and the srun tests then skip.
set -u
say() { echo "local-slurm: $*"; }
if ! command -v srun > /dev/null || ! command -v munged > /dev/null; then
  if [ "$(id -u)" != 0 ]; then say "srun/munged missing and not root: sudo apt-get install slurm-wlm munge"; exit 0; fi
  say "installing slurm-wlm munge (Debian)"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends slurm-wlm munge > /tmp/local-slurm-apt.log 2>&1 ||
    { apt-get update -q > /dev/null 2>&1; DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends slurm-wlm munge > /tmp/local-slurm-apt.log 2>&1; } ||
    { say "apt-get install failed (see /tmp/local-slurm-apt.log)"; exit 0; }
fi
if [ "$(id -u)" != 0 ]; then say "not root: not starting daemons"; exit 0; fi
mkdir -p /etc/munge /run/munge /var/log/munge /var/lib/munge /etc/slurm /var/spool/slurmctld /var/spool/slurmd /var/log/slurm
if [ ! -s /etc/munge/munge.key ]; then
  dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key 2> /dev/null
fi
chown -R munge:munge /etc/munge /run/munge /var/log/munge /var/lib/munge
chmod 400 /etc/munge/munge.key
pgrep -x munged > /dev/null || runuser -u munge -- /usr/sbin/munged || { say "munged did not start"; exit 0; }
if [ ! -e /etc/slurm/slurm.conf ]; then
  host=$(hostname -s)
  cpus=$(nproc)
  mem=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 * 9 / 10 ))
  say "writing /etc/slurm/slurm.conf: one node $host, $cpus CPUs"
  cat > /etc/slurm/slurm.conf <<CONF
# Written by exatrain's scripts/local-slurm.sh: a one-node Slurm for tests.
ClusterName=exatrain-local
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
JobAcctGatherType=jobacct_gather/none
NodeName=$host CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=local Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:8
CONF
fi
pgrep -x slurmctld > /dev/null || slurmctld || { say "slurmctld did not start (/var/log/slurm/slurmctld.log)"; exit 0; }
pgrep -x slurmd > /dev/null || slurmd || { say "slurmd did not start (/var/log/slurm/slurmd.log)"; exit 0; }
for i in $(seq 1 30); do
  if timeout 20 srun -n 1 true > /dev/null 2>&1; then say "srun works ($(sinfo -h -o '%N %C'))"; exit 0; fi
  sleep 1
done
say "srun does not run a job step; the srun tests will skip"
exit 0
