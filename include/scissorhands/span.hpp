#pragma once
// Non-owning spans whose memory space is part of the type (as in RAFT): a
// host_span cannot be passed where a device_span is expected.
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "config.hpp"

namespace scissorhands {

enum class memory_space { host, device };

template <class T, memory_space Space>
struct span {
  using element_type = T;
  static constexpr memory_space space = Space;

  T* data_ = nullptr;
  std::size_t size_ = 0;

  constexpr span() = default;
  SCISSORHANDS_HOST_DEVICE constexpr span(T* data, std::size_t size) : data_(data), size_(size) {}
  // A span of T converts to a span of const T in the same space, never across spaces.
  template <class U>
    requires(std::is_same_v<const U, T> && !std::is_same_v<U, T>)
  SCISSORHANDS_HOST_DEVICE constexpr span(span<U, Space> other) : data_(other.data()), size_(other.size()) {}

  SCISSORHANDS_HOST_DEVICE constexpr T* data() const { return data_; }
  SCISSORHANDS_HOST_DEVICE constexpr std::size_t size() const { return size_; }
  SCISSORHANDS_HOST_DEVICE constexpr bool empty() const { return size_ == 0; }
  // Any integral index, used as is: callers index with int32 and size_t alike.
  template <std::integral I>
  SCISSORHANDS_HOST_DEVICE constexpr T& operator[](I i) const { return data_[i]; }
  SCISSORHANDS_HOST_DEVICE constexpr T* begin() const { return data_; }
  SCISSORHANDS_HOST_DEVICE constexpr T* end() const { return data_ + size_; }
};

template <class T>
using host_span = span<T, memory_space::host>;
template <class T>
using device_span = span<T, memory_space::device>;

}  // namespace scissorhands
