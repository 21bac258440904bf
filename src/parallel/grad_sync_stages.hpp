// The four GradSync strategies (parallel/grad_sync.hpp), one file each: zero0_sync.cpp ...
// zero3_sync.cpp. Only make_grad_sync calls these.
#pragma once
#include <memory>

#include "parallel/grad_sync.hpp"

namespace exatrain::parallel {

std::unique_ptr<GradSync> make_zero0_sync(GradSyncSetup setup);
std::unique_ptr<GradSync> make_zero1_sync(GradSyncSetup setup);
std::unique_ptr<GradSync> make_zero2_sync(GradSyncSetup setup);
std::unique_ptr<GradSync> make_zero3_sync(GradSyncSetup setup);

}  // namespace exatrain::parallel
