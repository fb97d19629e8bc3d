#include "client/load/report.h"

#include <cmath>
#include <fstream>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"

namespace softmax::client {
namespace {

// Insertion order kept, so the file reads in the order below.
using Json = nlohmann::ordered_json;

std::vector<std::string> ShapeLabels(const LoadOptions& options) {
  std::vector<std::string> labels;
  for (const LoadShape& shape : options.shapes) labels.push_back(FormatLoadShape(shape));
  return labels;
}

double Micros(int64_t nanoseconds) { return static_cast<double>(nanoseconds) / 1e3; }

// JSON has no infinity: an unlimited duration is written as 0.
double SecondsOrZero(absl::Duration duration) {
  return duration == absl::InfiniteDuration() ? 0.0 : absl::ToDoubleSeconds(duration);
}

// Six significant digits; empty for a non-finite value.
std::string CsvNumber(double value) {
  return std::isfinite(value) ? absl::StrFormat("%.6g", value) : "";
}

std::string CsvField(const std::string& text) {
  if (text.find_first_of(",\"\r\n") == std::string::npos) return text;
  return absl::StrCat("\"", absl::StrReplaceAll(text, {{"\"", "\"\""}}), "\"");
}

}  // namespace

const char* GrpcStatusCodeName(int code) {
  static const char* const kNames[kGrpcStatusCodes] = {
      "OK",
      "CANCELLED",
      "UNKNOWN",
      "INVALID_ARGUMENT",
      "DEADLINE_EXCEEDED",
      "NOT_FOUND",
      "ALREADY_EXISTS",
      "PERMISSION_DENIED",
      "RESOURCE_EXHAUSTED",
      "FAILED_PRECONDITION",
      "ABORTED",
      "OUT_OF_RANGE",
      "UNIMPLEMENTED",
      "INTERNAL",
      "UNAVAILABLE",
      "DATA_LOSS",
      "UNAUTHENTICATED"};
  return code >= 0 && code < kGrpcStatusCodes ? kNames[code] : "UNKNOWN";
}

std::string FormatLoadReport(const LoadReport& report) {
  const LoadOptions& o = report.options;
  std::string text;
  const char* call = o.protocol == LoadProtocol::kKserve
                         ? (o.stream ? " (kserve ModelStreamInfer, stream)"
                                     : " (kserve ModelInfer, unary)")
                     : o.protocol == LoadProtocol::kHttp
                         ? " (http POST /v2/models/{model}/infer, binary data)"
                     : o.stream ? " (stream)"
                                : " (unary)";
  absl::StrAppend(&text, "target:       ", o.target, call, "\n");
  if (report.mode == "open") {
    absl::StrAppend(&text, "load:         open loop, ",
                    absl::StrFormat("%.0f", report.offered_rate), " requests/s ",
                    AbslUnparseFlag(o.arrival), ", ", o.connections, " connection(s)\n");
  } else {
    absl::StrAppend(&text, "load:         closed loop, concurrency ", o.concurrency, " over ",
                    o.connections, " connection(s)\n");
  }
  absl::StrAppend(&text, "payloads:     ", absl::StrJoin(ShapeLabels(o), " "), "\n");
  absl::StrAppend(&text, "requests:     ", report.requests, " (ok ", report.ok, ", errors ",
                  report.errors, ") in ", absl::StrFormat("%.3f", report.elapsed_seconds),
                  " s; warm-up ", report.warmup_requests, " (errors ", report.warmup_errors,
                  ")\n");
  for (int code = 1; code < kGrpcStatusCodes; ++code) {
    if (report.errors_by_code[code] > 0) {
      absl::StrAppend(&text, "  ", GrpcStatusCodeName(code), ": ", report.errors_by_code[code],
                      "\n");
    }
  }
  if (o.stream) {
    absl::StrAppend(&text, "streams:      ", report.stream_reopens, " reopened, ",
                    report.resent_requests, " request(s) resent");
    if (report.streams_lost > 0) {
      absl::StrAppend(&text, "; ", report.streams_lost, " lost by the transport, ",
                      report.resent_after_loss, " request(s) resent after that (some may "
                      "have been computed twice)");
    }
    absl::StrAppend(&text, "\n");
  }
  if (!report.ended_early.empty()) {
    absl::StrAppend(&text, "ended early:  ", report.ended_early, "\n");
  }
  absl::StrAppend(&text, "throughput:   ",
                  absl::StrFormat("%.1f requests/s, %.1f rows/s, %.4f GB/s payload\n",
                                  report.requests_per_second, report.rows_per_second,
                                  report.payload_gb_per_second));
  const LatencySummary& l = report.latency;
  absl::StrAppend(&text, "latency (ms): ",
                  absl::StrFormat("p50 %.3f  p90 %.3f  p99 %.3f  p99.9 %.3f  max %.3f  mean %.3f\n",
                                  l.p50 / 1e6, l.p90 / 1e6, l.p99 / 1e6, l.p999 / 1e6,
                                  l.max / 1e6, l.mean / 1e6));
  absl::StrAppend(&text, "server batch: ",
                  absl::StrFormat("mean %.2f requests, %.1f rows; mean queue %.1f us, compute "
                                  "%.1f us (kernels %.1f us, dispatch %.1f us)\n",
                                  report.mean_batch_requests, report.mean_batch_rows,
                                  report.mean_queue_us, report.mean_compute_us,
                                  report.mean_kernel_us, report.mean_dispatch_us));
  if (o.verify) {
    absl::StrAppend(&text, "verify:       ", report.verified, " responses checked, ",
                    report.mismatches, " mismatched\n");
    if (!report.first_mismatch.empty()) {
      absl::StrAppend(&text, "  first: ", report.first_mismatch, "\n");
    }
  }
  return text;
}

std::string FormatLoadProgress(const LoadProgress& progress) {
  return absl::StrFormat("[%6.1fs] %-9s %10.0f req/s  p50 %9.3f ms  p99 %9.3f ms  errors %d",
                         progress.elapsed_seconds, progress.measuring ? "measuring" : "warm-up",
                         progress.requests_per_second, progress.p50_ns / 1e6,
                         progress.p99_ns / 1e6, progress.errors);
}

std::string LoadReportJson(const LoadReport& report) {
  const LoadOptions& o = report.options;
  const LatencySummary& l = report.latency;
  Json errors_by_code = Json::object();
  for (int code = 1; code < kGrpcStatusCodes; ++code) {
    if (report.errors_by_code[code] > 0) {
      errors_by_code[GrpcStatusCodeName(code)] = report.errors_by_code[code];
    }
  }
  Json json;
  json["label"] = o.label;
  json["target"] = o.target;
  json["mode"] = report.mode;
  json["stream"] = o.stream;
  json["protocol"] = AbslUnparseFlag(o.protocol);
  json["connections"] = o.connections;
  json["concurrency"] = report.mode == "open" ? 0 : o.concurrency;
  json["offered_rate"] = report.offered_rate;
  json["arrival"] = AbslUnparseFlag(o.arrival);
  json["duration_s"] = SecondsOrZero(o.duration);
  json["warmup_s"] = SecondsOrZero(o.warmup);
  json["shapes"] = ShapeLabels(o);
  json["verify"] = o.verify;
  json["requests"] = report.requests;
  json["ok"] = report.ok;
  json["errors"] = report.errors;
  json["errors_by_code"] = std::move(errors_by_code);
  json["warmup_requests"] = report.warmup_requests;
  json["warmup_errors"] = report.warmup_errors;
  json["verified"] = report.verified;
  json["mismatches"] = report.mismatches;
  json["first_mismatch"] = report.first_mismatch;
  json["stream_reopens"] = report.stream_reopens;
  json["resent_requests"] = report.resent_requests;
  json["streams_lost"] = report.streams_lost;
  json["resent_after_loss"] = report.resent_after_loss;
  json["ended_early"] = report.ended_early;
  json["elapsed_s"] = report.elapsed_seconds;
  json["requests_per_s"] = report.requests_per_second;
  json["rows"] = report.rows;
  json["rows_per_s"] = report.rows_per_second;
  json["payload_bytes"] = report.payload_bytes;
  json["payload_gb_per_s"] = report.payload_gb_per_second;
  json["latency_us"] = {{"count", l.count},          {"min", Micros(l.min)},
                        {"mean", l.mean / 1e3},      {"p50", Micros(l.p50)},
                        {"p90", Micros(l.p90)},      {"p99", Micros(l.p99)},
                        {"p99.9", Micros(l.p999)},   {"max", Micros(l.max)}};
  json["batch"] = {{"mean_requests", report.mean_batch_requests},
                   {"mean_rows", report.mean_batch_rows},
                   {"mean_queue_us", report.mean_queue_us},
                   {"mean_compute_us", report.mean_compute_us},
                   {"mean_kernel_us", report.mean_kernel_us},
                   {"mean_dispatch_us", report.mean_dispatch_us}};
  // Labels and mismatch texts may hold any bytes: invalid UTF-8 is replaced
  // rather than thrown about. Non-finite numbers are written as null.
  return json.dump(2, ' ', false, Json::error_handler_t::replace) + "\n";
}

std::string LoadReportCsvHeader() {
  return "label,mode,stream,connections,concurrency,offered_rate,shapes,requests,ok,errors,"
         "mismatches,elapsed_s,requests_per_s,rows_per_s,payload_gb_per_s,p50_us,p90_us,p99_us,"
         "p999_us,max_us,mean_us,mean_batch_requests,mean_batch_rows\n";
}

std::string LoadReportCsvRow(const LoadReport& report) {
  const LoadOptions& o = report.options;
  const LatencySummary& l = report.latency;
  const std::vector<std::string> fields = {
      CsvField(o.label),
      report.mode,
      o.stream ? "1" : "0",
      absl::StrCat(o.connections),
      absl::StrCat(report.mode == "open" ? 0 : o.concurrency),
      CsvNumber(report.offered_rate),
      CsvField(absl::StrJoin(ShapeLabels(o), ";")),
      absl::StrCat(report.requests),
      absl::StrCat(report.ok),
      absl::StrCat(report.errors),
      absl::StrCat(report.mismatches),
      CsvNumber(report.elapsed_seconds),
      CsvNumber(report.requests_per_second),
      CsvNumber(report.rows_per_second),
      CsvNumber(report.payload_gb_per_second),
      CsvNumber(Micros(l.p50)),
      CsvNumber(Micros(l.p90)),
      CsvNumber(Micros(l.p99)),
      CsvNumber(Micros(l.p999)),
      CsvNumber(Micros(l.max)),
      CsvNumber(l.mean / 1e3),
      CsvNumber(report.mean_batch_requests),
      CsvNumber(report.mean_batch_rows)};
  return absl::StrCat(absl::StrJoin(fields, ","), "\n");
}

absl::Status WriteLoadReportJson(const std::string& path, const LoadReport& report) {
  std::ofstream file(path, std::ios::trunc);
  file << LoadReportJson(report);
  file.close();
  if (!file) return absl::InternalError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

absl::Status AppendLoadReportCsv(const std::string& path, const LoadReport& report) {
  bool needs_header = true;
  {
    std::ifstream existing(path, std::ios::ate);
    needs_header = !existing || existing.tellg() <= 0;
  }
  std::ofstream file(path, std::ios::app);
  if (needs_header) file << LoadReportCsvHeader();
  file << LoadReportCsvRow(report);
  file.close();
  if (!file) return absl::InternalError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

}  // namespace softmax::client
