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
    case Recompute::op: return "op";
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
const char* to_string(Fp8Recipe r) {
  switch (r) {
    case Fp8Recipe::delayed: return "delayed";
    case Fp8Recipe::tensorwise: return "tensorwise";
    case Fp8Recipe::rowwise: return "rowwise";
  }
  return "?";
}
const char* to_string(Attention a) {
  switch (a) {
    case Attention::flash2: return "flash2";
    case Attention::flash1: return "flash1";
    case Attention::flash3: return "flash3";
    case Attention::unfused: return "unfused";
  }
  return "?";
}
const char* to_string(TpCommOverlap o) {
  switch (o) {
    case TpCommOverlap::none: return "false";
    case TpCommOverlap::all: return "true";
    case TpCommOverlap::forward: return "\"forward\"";
  }
  return "?";
}
}  // namespace exatrain
