#include "job/job.hpp"

namespace exatrain {
const char* to_string(Activation a) { return a == Activation::gelu ? "gelu" : "swiglu"; }
const char* to_string(Norm n) { return n == Norm::layernorm ? "layernorm" : "rmsnorm"; }
const char* to_string(Position p) { return p == Position::learned ? "learned" : "rope"; }
const char* to_string(Recompute r) {
  switch (r) {
    case Recompute::none: return "none";
    case Recompute::selective: return "selective";
    case Recompute::full: return "full";
  }
  return "?";
}
const char* to_string(Schedule s) { return s == Schedule::gpipe ? "gpipe" : "1f1b"; }
const char* to_string(Precision p) {
  switch (p) {
    case Precision::fp32: return "fp32";
    case Precision::fp16: return "fp16";
    case Precision::bf16: return "bf16";
    case Precision::fp8: return "fp8";
  }
  return "?";
}
}  // namespace exatrain
