#include "client/load/mode.h"

#include <atomic>
#include <csignal>
#include <cstdio>
#include <iostream>

#include <unistd.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/exit_codes.h"
#include "client/load/engine.h"
#include "client/load/report.h"

namespace softmax::client {
namespace {

// Set by SIGINT and SIGTERM while a load runs: stop sending, drain, report.
std::atomic<bool> g_stop_requested{false};

void RequestStop(int) { g_stop_requested.store(true, std::memory_order_relaxed); }

}  // namespace

int RunLoadMode(const LoadOptions& options, const LoadModeOutputs& outputs) {
  LoadMonitor monitor;
  monitor.stop_requested = &g_stop_requested;
  const bool show_progress = !outputs.quiet && isatty(STDERR_FILENO);
  if (show_progress) {
    monitor.on_progress = [](const LoadProgress& progress) {
      std::fprintf(stderr, "\r%s   ", FormatLoadProgress(progress).c_str());
      std::fflush(stderr);
    };
  }
  g_stop_requested.store(false);
  const auto previous_int = std::signal(SIGINT, RequestStop);
  const auto previous_term = std::signal(SIGTERM, RequestStop);
  absl::StatusOr<LoadReport> report = RunLoad(options, monitor);
  std::signal(SIGINT, previous_int);
  std::signal(SIGTERM, previous_term);
  if (show_progress) {
    std::fprintf(stderr, "\r%100s\r", "");
    std::fflush(stderr);
  }
  if (!report.ok()) return ExitWithStatus(kExitRpcFailed, report.status());
  std::cout << FormatLoadReport(*report) << std::flush;

  int exit_code = kExitOk;
  if (!outputs.json_path.empty()) {
    if (absl::Status written = WriteLoadReportJson(outputs.json_path, *report); !written.ok()) {
      exit_code = ExitWithStatus(kExitRpcFailed, written);
    }
  }
  if (!outputs.csv_path.empty()) {
    if (absl::Status written = AppendLoadReportCsv(outputs.csv_path, *report); !written.ok()) {
      exit_code = ExitWithStatus(kExitRpcFailed, written);
    }
  }
  if (!report->ended_early.empty()) {
    std::cerr << "softmax-client: the run ended early: " << report->ended_early << "\n";
    exit_code = kExitRpcFailed;
  }
  if (options.verify) {
    const int64_t failed = report->errors + report->warmup_errors;
    if (report->mismatches > 0 || failed > 0 || report->verified == 0) {
      std::cerr << "softmax-client: verify failed: " << report->mismatches << " mismatched, "
                << failed << " failed, " << report->verified << " checked\n";
      exit_code = kExitRpcFailed;
    }
  }
  return exit_code;
}

}  // namespace softmax::client
