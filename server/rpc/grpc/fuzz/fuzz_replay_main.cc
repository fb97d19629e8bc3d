// A main() for a libFuzzer target in builds without libFuzzer (gcc, the
// sanitizer build, CI): runs LLVMFuzzerTestOneInput on every file named
// (directories: every file in them), then on a bounded number of random
// mutations of them (byte flips, insertions, deletions, truncations, and
// splices of two files) from a fixed seed, so a failure reproduces.
//
// Usage: TARGET [--mutations=N] [--seed=S] FILE_OR_DIR...
// Exit 0 when every input ran; a failed check aborts (the target's own).
#include <dirent.h>
#include <sys/stat.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

void Collect(const std::string& path, std::vector<std::string>* inputs) {
  struct stat info {};
  if (stat(path.c_str(), &info) != 0) {
    std::fprintf(stderr, "fuzz_replay: cannot read %s\n", path.c_str());
    std::exit(2);
  }
  if (S_ISDIR(info.st_mode)) {
    DIR* dir = opendir(path.c_str());
    while (dirent* entry = dir != nullptr ? readdir(dir) : nullptr) {
      if (entry->d_name[0] != '.') Collect(path + "/" + entry->d_name, inputs);
    }
    if (dir != nullptr) closedir(dir);
    return;
  }
  std::ifstream file(path, std::ios::binary);
  std::stringstream bytes;
  bytes << file.rdbuf();
  inputs->push_back(bytes.str());
}

void Run(const std::string& input) {
  LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(input.data()), input.size());
}

std::string Mutate(const std::vector<std::string>& inputs, std::mt19937_64& random) {
  std::string out = inputs[random() % inputs.size()];
  const int edits = 1 + static_cast<int>(random() % 4);
  for (int e = 0; e < edits; ++e) {
    const size_t at = out.empty() ? 0 : random() % (out.size() + 1);
    switch (random() % 6) {
      case 0:  // flip bits of one byte
        if (!out.empty()) out[at % out.size()] ^= static_cast<char>(1 + random() % 255);
        break;
      case 1:  // an interesting byte
        if (!out.empty()) {
          constexpr char kBytes[] = {0, 1, 0x7f, static_cast<char>(0x80),
                                     static_cast<char>(0xff), '[', '{', '"', '-', '9'};
          out[at % out.size()] = kBytes[random() % sizeof(kBytes)];
        }
        break;
      case 2:  // insert random bytes
        out.insert(at, std::string(1 + random() % 8, static_cast<char>(random())));
        break;
      case 3:  // delete a run
        if (!out.empty()) out.erase(at % out.size(), 1 + random() % 8);
        break;
      case 4:  // truncate
        out.resize(at);
        break;
      default: {  // splice with another input
        const std::string& other = inputs[random() % inputs.size()];
        const size_t from = other.empty() ? 0 : random() % other.size();
        out = out.substr(0, at) + other.substr(from);
        break;
      }
    }
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  long mutations = 0;
  unsigned long long seed = 1;
  std::vector<std::string> inputs;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--mutations=", 12) == 0) {
      mutations = std::strtol(argv[i] + 12, nullptr, 10);
    } else if (std::strncmp(argv[i], "--seed=", 7) == 0) {
      seed = std::strtoull(argv[i] + 7, nullptr, 10);
    } else {
      Collect(argv[i], &inputs);
    }
  }
  if (inputs.empty()) {
    std::fprintf(stderr, "usage: %s [--mutations=N] [--seed=S] FILE_OR_DIR...\n", argv[0]);
    return 2;
  }
  const auto start = std::chrono::steady_clock::now();
  for (const std::string& input : inputs) Run(input);
  std::mt19937_64 random(seed);
  for (long m = 0; m < mutations; ++m) Run(Mutate(inputs, random));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("fuzz_replay: %zu inputs and %ld mutations (seed %llu) in %.1f s, no failure\n",
              inputs.size(), mutations, seed, seconds);
  return 0;
}
