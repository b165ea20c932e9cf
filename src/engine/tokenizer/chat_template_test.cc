#include "engine/tokenizer/chat_template.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace stoke {
namespace {

using ::testing::HasSubstr;

// SmolLM2-135M-Instruct's tokenizer.chat_template, verbatim from the GGUF (newlines are real newlines inside
// the Jinja string literals).
const std::string kSmolLm2 =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ "
    "'<|im_start|>system\n"
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif "
    "%}{{'<|im_start|>' "
    "+ message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if "
    "add_generation_prompt "
    "%}{{ '<|im_start|>assistant\n' }}{% endif %}";

// Qwen-style: escaped \n in the literals, the default system message in an else branch after a non-literal
// one.
const std::string kQwenLike =
    "{%- if messages[0]['role'] == 'system' %}{{- '<|im_start|>system\\n' + messages[0]['content'] + "
    "'<|im_end|>\\n' }}{%- else %}{{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are "
    "a "
    "helpful assistant.<|im_end|>\\n' }}{%- endif %}{%- for message in messages %}...<|im_start|>...";

const std::string kLlama30 =
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + "
    "message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 "
    "== 0 "
    "%}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if "
    "add_generation_prompt %}{{ "
    "'<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}";

const std::string kLlama31Head =
    "{{- bos_token }}\n{%- if not date_string is defined %}\n    {%- set date_string = \"26 Jul 2024\" "
    "%}\n{%- endif "
    "%}\n{{- \"<|start_header_id|>system<|end_header_id|>\\n\\n\" }}\n{{- \"Cutting Knowledge Date: December "
    "2023\\n\" }}\n{{- \"Today Date: \" + date_string + \"\\n\\n\" }} ... '<|eot_id|>'";

TEST(ChatTemplate, SmolLm2InjectsDefaultSystem) {
  auto ct = ChatTemplate::FromString(kSmolLm2);
  ASSERT_TRUE(ct.ok()) << ct.status().ToString();
  EXPECT_EQ(ct->name(), "chatml");
  EXPECT_EQ(ct->default_system(), "You are a helpful AI assistant named SmolLM, trained by Hugging Face");
  auto out = ct->Apply({{"user", "Hi there"}, {"assistant", "Hello!"}, {"user", "2+2?"}});
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(
      *out,
      "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
      "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n"
      "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n");
}

TEST(ChatTemplate, ChatMlKeepsCallerSystemAndRawContent) {
  auto ct = *ChatTemplate::FromString(kSmolLm2);
  auto out = ct.Apply({{"system", "Be terse."}, {"user", "  spaced  "}}, /*add_generation_prompt=*/false);
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(*out, "<|im_start|>system\nBe terse.<|im_end|>\n<|im_start|>user\n  spaced  <|im_end|>\n");
  EXPECT_EQ(*ct.Apply({}), "<|im_start|>assistant\n");  // the default system is injected inside the loop only
}

TEST(ChatTemplate, QwenStyleDefaultSystemWithEscapes) {
  auto ct = ChatTemplate::FromString(kQwenLike);
  ASSERT_TRUE(ct.ok());
  EXPECT_EQ(ct->default_system(), "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.");
}

TEST(ChatTemplate, Llama30) {
  auto ct = ChatTemplate::FromString(kLlama30);
  ASSERT_TRUE(ct.ok());
  EXPECT_EQ(ct->name(), "llama3");
  auto out = ct->Apply({{"system", "Sys"}, {"user", " hi \n"}});
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(*out,
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nSys<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

TEST(ChatTemplate, Llama31KnowledgeBlockWithPinnedDate) {
  auto ct = ChatTemplate::FromString(kLlama31Head);
  ASSERT_TRUE(ct.ok());
  EXPECT_EQ(ct->date_string(), "26 Jul 2024");
  ct->set_date_string("01 Jan 2025");
  auto out = ct->Apply({{"system", "You help."}, {"user", "Hi"}});
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(*out,
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
            "Cutting Knowledge Date: December 2023\nToday Date: 01 Jan 2025\n\nYou help.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  // Without a system message the block is still there, with an empty system text.
  auto no_sys = ct->Apply({{"user", "Hi"}}, false);
  EXPECT_THAT(*no_sys, HasSubstr("Today Date: 01 Jan 2025\n\n<|eot_id|><|start_header_id|>user"));
}

TEST(ChatTemplate, UnknownTemplateNamesASnippet) {
  auto ct = ChatTemplate::FromString("{% for m in messages %}[INST] {{ m['content'] }} [/INST]{% endfor %}");
  ASSERT_FALSE(ct.ok());
  EXPECT_EQ(ct.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(ct.status().message(), HasSubstr("[INST]"));
}

TEST(ChatTemplate, MissingModelIsAnError) {
  auto ct = ChatTemplate::FromModel("/nonexistent/model.gguf");
  EXPECT_FALSE(ct.ok());
}

}  // namespace
}  // namespace stoke
