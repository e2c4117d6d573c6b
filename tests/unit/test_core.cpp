// Core types: dtype promotion, shapes, errors, devices, scopes.
#include <gtest/gtest.h>

#include <cmath>

#include "core/fail.h"
#include "core/half.h"
#include "tessera/tessera.h"

namespace ts = tessera;
using ts::DType;

TEST(Core, PromotionFollowsPyTorch) {
  EXPECT_EQ(ts::promote(DType::Int32, DType::Int64), DType::Int64);
  EXPECT_EQ(ts::promote(DType::Int64, DType::Float16), DType::Float16);
  EXPECT_EQ(ts::promote(DType::Float16, DType::BFloat16), DType::Float32);
  EXPECT_EQ(ts::promote(DType::Float32, DType::Float64), DType::Float64);
  EXPECT_EQ(ts::promote(DType::Bool, DType::Int32), DType::Int32);
  // Weak scalars: a float tensor keeps its dtype; an int tensor meeting 0.5 becomes float32.
  EXPECT_EQ(ts::promote_scalar(DType::Float16, 2.5), DType::Float16);
  EXPECT_EQ(ts::promote_scalar(DType::Int32, 3), DType::Int32);
  EXPECT_EQ(ts::promote_scalar(DType::Int32, 0.5), DType::Float32);
  EXPECT_EQ(ts::promote_scalar(DType::Bool, 2), DType::Int64);
}

TEST(Core, ShapesAndBroadcasting) {
  EXPECT_EQ(ts::broadcast_shapes({3, 1, 5}, {4, 1}, "add"), (ts::Shape{3, 4, 5}));
  EXPECT_EQ(ts::broadcast_shapes({}, {2, 0}, "add"), (ts::Shape{2, 0}));
  EXPECT_EQ(ts::contiguous_strides({2, 3, 4}), (std::vector<int64_t>{12, 4, 1}));
  EXPECT_EQ(ts::numel({2, 0, 3}), 0);
  EXPECT_EQ(ts::wrap_dim(-1, 3, "sum"), 2);
  try {
    ts::broadcast_shapes({2, 3}, {4, 3}, "mul");
    FAIL();
  } catch (const ts::Error& e) {
    EXPECT_EQ(std::string(e.what()).rfind("[mul] shapes [2, 3] and [4, 3]", 0), 0u) << e.what();
  }
}

TEST(Core, ErrorNamesOpThenDetailThenScope) {
  ts::Scope a("blocks"), b("2"), c("attn");
  EXPECT_EQ(ts::current_scope(), "blocks.2.attn");
  try {
    ts::fail("matmul", "shapes [2, 3] and [4, 5]");
    FAIL();
  } catch (const ts::Error& e) {
    EXPECT_STREQ(e.what(), "[matmul] shapes [2, 3] and [4, 5] (in scope 'blocks.2.attn')");
  }
}

TEST(Core, ScopesNestAndUnwind) {
  EXPECT_EQ(ts::current_scope(), "");
  {
    ts::Scope a("encoder");
    {
      ts::Scope b("layer0");
      EXPECT_EQ(ts::current_scope(), "encoder.layer0");
    }
    EXPECT_EQ(ts::current_scope(), "encoder");
  }
  EXPECT_EQ(ts::current_scope(), "");
}

TEST(Core, DeviceNames) {
  EXPECT_EQ(ts::Device("cpu").str(), "cpu:0");
  EXPECT_EQ(ts::Device("cpu:0"), ts::Device("cpu"));
  EXPECT_EQ(ts::Device("null:0").kind, "null");
  EXPECT_THROW(ts::Device("cpu:x"), ts::Error);
  EXPECT_EQ(ts::Device::best().kind, "cpu");
  bool cpu = false, null = false;
  for (auto& d : ts::devices()) {
    cpu |= d.device.kind == "cpu" && d.can_execute;
    null |= d.device.kind == "null" && !d.can_execute;
  }
  EXPECT_TRUE(cpu && null);
  EXPECT_THROW(ts::zeros({2}, {DType::Float32, ts::Device("tpu")}).item(), ts::Error);
}

TEST(Core, HalfConversionsRoundToNearestEven) {
  using namespace ts::half;
  EXPECT_EQ(f16_to_float(float_to_f16(1.0f)), 1.0f);
  EXPECT_EQ(f16_to_float(float_to_f16(65504.0f)), 65504.0f);           // largest finite
  EXPECT_TRUE(std::isinf(f16_to_float(float_to_f16(65520.0f))));      // rounds up to inf
  EXPECT_EQ(f16_to_float(float_to_f16(1.0f + 1.0f / 2048)), 1.0f);     // tie -> even
  EXPECT_EQ(f16_to_float(float_to_f16(1.0f + 3.0f / 2048)), 1.0f + 2.0f / 1024);
  EXPECT_EQ(f16_to_float(float_to_f16(5.960464477539063e-08f)), 5.960464477539063e-08f);  // smallest subnormal
  EXPECT_EQ(bf16_to_float(float_to_bf16(1.0f + 1.0f / 256)), 1.0f);    // tie -> even
  EXPECT_EQ(bf16_to_float(float_to_bf16(3.0f)), 3.0f);
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(NAN))));
}
