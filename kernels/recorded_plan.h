// Launch plans recorded on GPUs (LaunchPlan::ToString(), as the server logs
// it at start), kept as test data in kernels/testdata/ so that planning runs
// without a GPU: schedule_test checks the batch-invariance rule on them and
// plan_bench times the planner with the H200's.
//
// The folder is $SOFTMAX_KERNELS_TESTDATA where set (binaries run away from
// the source tree), else the source tree's (SOFTMAX_KERNELS_TESTDATA_DIR,
// set by kernels/CMakeLists.txt), else kernels/testdata under the working
// directory.
#ifndef SOFTMAX_KERNELS_RECORDED_PLAN_H_
#define SOFTMAX_KERNELS_RECORDED_PLAN_H_

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "kernels/softmax_cuda.h"

namespace softmax {
namespace gpu {

// The text of the recorded plan `file` (e.g. "h200_plan.txt"); empty when no
// folder holds it.
inline std::string RecordedPlanText(const std::string& file) {
  std::string folders[3];
  if (const char* env = std::getenv("SOFTMAX_KERNELS_TESTDATA")) folders[0] = env;
#ifdef SOFTMAX_KERNELS_TESTDATA_DIR
  folders[1] = SOFTMAX_KERNELS_TESTDATA_DIR;
#endif
  folders[2] = "kernels/testdata";
  for (const std::string& folder : folders) {
    if (folder.empty()) continue;
    std::ifstream in(folder + "/" + file);
    if (!in) continue;
    std::ostringstream text;
    text << in.rdbuf();
    return text.str();
  }
  return "";
}

// Parses the recorded plan `file` into *plan; false when it is missing or
// not a plan.
inline bool ReadRecordedPlan(const std::string& file, LaunchPlan* plan) {
  const std::string text = RecordedPlanText(file);
  return !text.empty() && LaunchPlan::Parse(text, plan);
}

}  // namespace gpu
}  // namespace softmax

#endif  // SOFTMAX_KERNELS_RECORDED_PLAN_H_
