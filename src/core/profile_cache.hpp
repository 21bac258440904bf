// Where `exatrain profile` keeps what it measured on this machine, and whether that file describes
// this machine (docs/planner.md "This machine: exatrain profile"). The job parser layers its
// [machine] over the `local` cluster preset and the catalog its [cpu-local], [cpu-local-2c] over
// the shipped device entries, so `predict`, `plan`, `report` and `train`'s "auto" plans use the
// measured costs.
//
//   file        $EXATRAIN_PROFILE_DIR/profile-HOST.toml, else $XDG_CACHE_HOME/exatrain/..., else
//               $HOME/.cache/exatrain/... (HOST: this machine's host name)
//   used when   it exists, its [profile] fingerprint equals machine_fingerprint() (host name, CPU
//               model, core count, memory: another machine's or a changed machine's profile is
//               ignored), and EXATRAIN_PROFILE is not "off" (the tests and the tutorial set it, so
//               that they read the shipped catalog: their figures must not depend on a profile)
//   refreshed   by running `exatrain profile` again (it overwrites the file)
//   fallback    without one, the shipped catalog entries (catalog/devices.toml cpu-local and
//               cpu-local-2c, catalog/clusters/local.toml), measured once on the project's machine
#pragma once
#include <optional>
#include <string>

namespace exatrain {

std::string profile_cache_file();
// "host=NAME; cpu=MODEL; cores=N; memory_kib=M" of this machine.
std::string machine_fingerprint();
// The profile file when it is to be used; otherwise nullopt and, in *why, the reason (disabled,
// absent, another machine's, unreadable).
std::optional<std::string> active_profile(std::string* why = nullptr);

}  // namespace exatrain
