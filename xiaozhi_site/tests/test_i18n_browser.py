"""A Chinese browser sees the admin in Chinese and switches languages from the header."""
from __future__ import annotations

from typing import Any

import pytest
from django.utils import timezone

from conversations.models import Conversation, Turn
from devices.models import Device
from xiaozhi_site.tests.test_i18n_admin import chinese_persona

pytestmark = [pytest.mark.e2e, pytest.mark.browser]


def _click_language(browser: Any, code: str) -> None:
    from selenium.webdriver.common.by import By

    browser.driver.find_element(By.CSS_SELECTOR, f'#language-switch button[value="{code}"]').click()


def test_a_chinese_browser_sees_the_admin_in_chinese_and_switches_to_english_and_back(
    asgi_server: Any, browser_factory: Any, staff_user: Any
) -> None:
    persona = chinese_persona()
    device = Device.objects.create(mac="02:00:00:00:00:21", name="客厅音箱", board_type="bread-compact-wifi",
                                   owner=staff_user, persona=persona, bound_at=timezone.now(), is_online=True)
    conversation = Conversation.objects.create(session_id="s-zh-1", device=device, persona=persona)
    Turn.objects.create(conversation=conversation, index=0, user_text="今天天气怎么样？",
                        reply_text="今天北京晴，最高气温二十五度。", emotion="happy", timings={"asr_done": 180.0})
    browser = browser_factory(asgi_server.http_url, language="zh-CN")

    browser.open("/admin/login/")
    assert "小智服务器" in browser.text() and "用户名" in browser.text()
    browser.screenshot("01-login-zh")
    browser.login("alice", "alice-password")
    browser.wait_for(lambda: "设备管理后台" in browser.text(), what="the Chinese admin index")
    assert {"设备", "固件发布", "角色", "对话", "MCP 服务器"} <= set(browser.text().split("\n"))
    browser.screenshot("02-index-zh")

    browser.open("/admin/devices/device/")
    assert "绑定设备" in browser.text() and "MAC 地址" in browser.text() and "客厅音箱" in browser.text()
    browser.screenshot("03-devices-zh")

    browser.open(f"/admin/conversations/persona/{persona.pk}/change/")
    assert "系统提示词" in browser.text() and "提示词与话术" in browser.text() and "可用占位符" in browser.text()
    browser.screenshot("04-persona-zh")

    page = f"/admin/conversations/conversation/{conversation.pk}/change/"
    browser.open(page)
    text = browser.text()  # the review page: a chat with its waterfall
    assert "今天天气怎么样？" in text and "用户" in text and "仍在进行" in text and "语音识别完成" in text
    browser.screenshot("05-conversation-zh")

    _click_language(browser, "en")
    browser.wait_for(lambda: "still open" in browser.text(), what="the page in English")
    assert browser.driver.current_url.endswith(page) and "用户说" not in browser.text()
    browser.screenshot("06-conversation-en")
    browser.open("/admin/")  # the choice is remembered across pages despite the Chinese browser
    browser.wait_for(lambda: "Fleet administration" in browser.text(), what="the English index")
    browser.screenshot("07-index-en")

    _click_language(browser, "zh-hans")
    browser.wait_for(lambda: "设备管理后台" in browser.text(), what="the index in Chinese again")
    browser.screenshot("08-index-zh-again")
