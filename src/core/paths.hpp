// Where exatrain finds its data files (models/, catalog/, corpus/): $EXATRAIN_HOME when set,
// else the source tree it was built from (so a build runs in place without installing).
#pragma once
#include <cstdlib>
#include <string>

namespace exatrain {
inline std::string data_root() {
  if (const char* home = std::getenv("EXATRAIN_HOME"); home && *home) return home;
  return EXATRAIN_SOURCE_DIR;
}
}  // namespace exatrain
