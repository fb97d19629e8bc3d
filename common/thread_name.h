// Names the calling thread, so that `top -H`, perf, gdb and /proc show what
// each of the server's threads is for.
//
// Thread-safety: affects only the calling thread.
#ifndef SOFTMAX_COMMON_THREAD_NAME_H_
#define SOFTMAX_COMMON_THREAD_NAME_H_

#include <pthread.h>

#include <string>

namespace softmax::server {

// Linux keeps at most 15 characters; longer names are cut.
inline void NameThisThread(const std::string& name) {
  pthread_setname_np(pthread_self(), name.substr(0, 15).c_str());
}

}  // namespace softmax::server

#endif  // SOFTMAX_COMMON_THREAD_NAME_H_
