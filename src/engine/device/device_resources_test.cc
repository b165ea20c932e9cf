// Device resources on a real GPU (label gpu; skipped without one).
#include "engine/device/device_resources.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "kernels/cuda/device.h"

namespace stoke::device {
namespace {

#define SKIP_WITHOUT_GPU() \
  if (::stoke::cuda::DeviceCount() == 0) GTEST_SKIP() << "no CUDA device: skipped"

TEST(DeviceArena, AlignsAndRefusesOverflow) {
  SKIP_WITHOUT_GPU();
  auto arena = DeviceArena::Create(4096);
  ASSERT_TRUE(arena.ok()) << arena.status().ToString();
  auto a = (*arena)->Allocate(10);
  auto b = (*arena)->Allocate(100);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(*a) % DeviceArena::kAlignment, 0u);
  EXPECT_EQ(static_cast<char*>(*b) - static_cast<char*>(*a), 256);
  auto big = (*arena)->Allocate(4000);
  ASSERT_FALSE(big.ok());
  EXPECT_EQ(big.status().code(), StatusCode::kResourceExhausted);
  (*arena)->Reset();
  auto c = (*arena)->Allocate(4096);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(*c, *a);
  EXPECT_EQ((*arena)->high_water(), 4096u);
}

TEST(PinnedHostPool, ReusesBuffersAndCopiesRoundTrip) {
  SKIP_WITHOUT_GPU();
  PinnedHostPool pool;
  auto b1 = pool.Acquire(5000);
  ASSERT_TRUE(b1.ok());
  EXPECT_EQ(b1->capacity, 8192u);
  void* first = b1->data;
  pool.Release(*b1);
  auto b2 = pool.Acquire(6000);
  ASSERT_TRUE(b2.ok());
  EXPECT_EQ(b2->data, first);  // same size class: reused, no new pinned allocation
  EXPECT_EQ(pool.bytes_allocated(), 8192u);

  auto stream = Stream::Create();
  ASSERT_TRUE(stream.ok());
  auto start = Event::Create(), end = Event::Create();
  ASSERT_TRUE(start.ok() && end.ok());
  auto arena = DeviceArena::Create(1 << 20);
  ASSERT_TRUE(arena.ok());
  auto dev = (*arena)->Allocate(6000);
  ASSERT_TRUE(dev.ok());
  std::memset(b2->data, 0x5a, 6000);
  ASSERT_TRUE(start->Record(stream->get()).ok());
  ASSERT_EQ(cudaMemcpyAsync(*dev, b2->data, 6000, cudaMemcpyHostToDevice, stream->get()), cudaSuccess);
  std::vector<unsigned char> back(6000, 0);
  ASSERT_EQ(cudaMemcpyAsync(back.data(), *dev, 6000, cudaMemcpyDeviceToHost, stream->get()), cudaSuccess);
  ASSERT_TRUE(end->Record(stream->get()).ok());
  ASSERT_TRUE(stream->Synchronize().ok());
  EXPECT_TRUE(end->Done());
  for (unsigned char c : back) ASSERT_EQ(c, 0x5a);
  auto ms = Event::ElapsedMs(*start, *end);
  ASSERT_TRUE(ms.ok()) << ms.status().ToString();
  EXPECT_GE(*ms, 0.f);
  pool.Release(*b2);
}

}  // namespace
}  // namespace stoke::device
