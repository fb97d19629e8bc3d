// `softmax-client load`: runs the load engine (client/load/engine.h) with a
// live progress line on a terminal, prints the report, writes the JSON and CSV
// reports (client/load/report.h), and turns --verify's findings into the exit
// code. SIGINT and SIGTERM during the run stop it early: it stops sending,
// drains, and still reports.
//
// Thread-safety: RunLoadMode installs process-wide signal handlers for the
// length of the run (restoring the previous ones after) and writes to
// std::cout and std::cerr; call it from one thread, once at a time.
#ifndef SOFTMAX_CLIENT_LOAD_MODE_H_
#define SOFTMAX_CLIENT_LOAD_MODE_H_

#include <string>

#include "client/load/options.h"

namespace softmax::client {

// What load mode does besides the run itself; main.cc fills it from the flags.
struct LoadModeOutputs {
  std::string json_path;  // empty: no JSON report
  std::string csv_path;   // empty: no CSV row
  bool quiet = false;     // no progress line even on a terminal
};

// Runs `options` and reports it. Returns the process's exit code
// (client/exit_codes.h): kExitRpcFailed when the run could not be made, a
// report could not be written, or with options.verify any request failed or
// mismatched or none was checked; else kExitOk.
int RunLoadMode(const LoadOptions& options, const LoadModeOutputs& outputs);

}  // namespace softmax::client

#endif  // SOFTMAX_CLIENT_LOAD_MODE_H_
