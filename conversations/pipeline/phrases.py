"""What the server itself says to a device, in the conversation's language.

The LLM answers in whatever language it is asked to; these are the few sentences the server
speaks on its own: the activation code of an unbound device, the apology when every provider
failed (or the model stalled), the filler while the user waits for a slow model or tool, the
greeting after the wake word, and the goodbye (idle timeout, exit phrase,
`end_conversation`). Pure Python, no Django: the pipeline passes the persona's (or the
session's current reply) language in. Add a language by adding a column to `PHRASES`;
anything else falls back to English. docs/i18n.md explains how languages are picked.
"""
from __future__ import annotations

from conversations.providers.tts.voices import base_language

FALLBACK_LANGUAGE = "en"

# key -> language -> text. `{digits}` is the code with its digits spaced, so every TTS
# engine reads them one by one ("0 3 2 1 2 5") instead of as one number.
PHRASES: dict[str, dict[str, str]] = {
    "activation_code": {
        "en": "Please bind this device in the admin with code {digits}.",
        "zh": "请在管理后台输入验证码 {digits}",
        "ja": "管理画面でこの認証コードを入力してください：{digits}",
        "ko": "관리 페이지에서 인증 코드 {digits} 를 입력해 주세요.",
        "de": "Bitte koppeln Sie dieses Gerät in der Verwaltung mit dem Code {digits}.",
        "fr": "Veuillez associer cet appareil dans l'administration avec le code {digits}.",
        "ru": "Привяжите это устройство в панели управления с кодом {digits}.",
        "pt": "Vincule este dispositivo no painel de administração com o código {digits}.",
        "es": "Vincula este dispositivo en el panel de administración con el código {digits}.",
        "it": "Associa questo dispositivo nel pannello di amministrazione con il codice {digits}.",
    },
    "activation_unbound": {
        "en": "This device is not bound yet. Please bind it in the admin.",
        "zh": "这台设备还没有绑定，请在管理后台完成绑定。",
        "ja": "このデバイスはまだ登録されていません。管理画面で登録してください。",
        "ko": "이 기기는 아직 등록되지 않았습니다. 관리 페이지에서 등록해 주세요.",
        "de": "Dieses Gerät ist noch nicht gekoppelt. Bitte koppeln Sie es in der Verwaltung.",
        "fr": "Cet appareil n'est pas encore associé. Veuillez l'associer dans l'administration.",
        "ru": "Это устройство ещё не привязано. Привяжите его в панели управления.",
        "pt": "Este dispositivo ainda não está vinculado. Vincule-o no painel de administração.",
        "es": "Este dispositivo aún no está vinculado. Vincúlalo en el panel de administración.",
        "it": "Questo dispositivo non è ancora associato. Associalo nel pannello di amministrazione.",
    },
    "apology": {
        "en": "Sorry, something went wrong. Please try again.",
        "zh": "抱歉，我这边出了点问题，请再说一遍。",
        "ja": "すみません、問題が発生しました。もう一度お願いします。",
        "ko": "죄송해요, 문제가 생겼어요. 다시 한 번 말씀해 주세요.",
        "de": "Entschuldigung, da ist etwas schiefgelaufen. Bitte versuch es noch einmal.",
        "fr": "Désolé, un problème est survenu. Peux-tu répéter ?",
        "ru": "Извините, что-то пошло не так. Повторите, пожалуйста.",
        "pt": "Desculpe, algo deu errado. Pode repetir?",
        "es": "Lo siento, algo salió mal. ¿Puedes repetirlo?",
        "it": "Scusa, qualcosa è andato storto. Puoi ripetere?",
    },
    "filler": {
        "en": "One moment, please.",
        "zh": "请稍等。",
        "ja": "少々お待ちください。",
        "ko": "잠시만 기다려 주세요.",
        "de": "Einen Moment, bitte.",
        "fr": "Un instant, s'il te plaît.",
        "ru": "Одну секунду, пожалуйста.",
        "pt": "Um momento, por favor.",
        "es": "Un momento, por favor.",
        "it": "Un momento, per favore.",
    },
    "greeting": {
        "en": "Hi, I'm listening.",
        "zh": "你好，我在听。",
        "ja": "はい、聞いていますよ。",
        "ko": "네, 듣고 있어요.",
        "de": "Hallo, ich höre zu.",
        "fr": "Bonjour, je t'écoute.",
        "ru": "Привет, я слушаю.",
        "pt": "Olá, estou ouvindo.",
        "es": "Hola, te escucho.",
        "it": "Ciao, ti ascolto.",
    },
    "farewell": {
        "en": "Goodbye!",
        "zh": "再见！",
        "ja": "さようなら！",
        "ko": "안녕히 계세요!",
        "de": "Auf Wiedersehen!",
        "fr": "Au revoir !",
        "ru": "До свидания!",
        "pt": "Tchau!",
        "es": "¡Adiós!",
        "it": "Arrivederci!",
    },
}


def phrase(key: str, language: str | None, **values: str) -> str:
    texts = PHRASES[key]
    text = texts.get(base_language(language)) or texts[FALLBACK_LANGUAGE]
    return text.format(**values) if values else text


def activation_prompt(code: str | None, language: str | None) -> str:
    """What an unbound device says: its code digit by digit, or that it must be bound."""
    if not code:
        return phrase("activation_unbound", language)
    return phrase("activation_code", language, digits=" ".join(code))


def apology(language: str | None) -> str:
    return phrase("apology", language)


def filler(language: str | None) -> str:
    """Said once in a turn whose first words or tool call keep the user waiting."""
    return phrase("filler", language)


def _localized(configured: str, key: str, language: str | None) -> str:
    """The persona's own text, except that a stock phrase of the table (any language: the
    model's default "Goodbye!", or a default persona switched to another language) is said
    in `language`. Empty stays empty."""
    text = configured.strip()
    if text and text in PHRASES[key].values():
        return phrase(key, language)
    return text


def greeting(configured: str, language: str | None) -> str:
    """The wake-word greeting; empty means none."""
    return _localized(configured, "greeting", language)


def farewell(configured: str, language: str | None) -> str:
    """The idle-timeout farewell; empty means the device just closes."""
    return _localized(configured, "farewell", language)


def goodbye(configured: str, language: str | None) -> str:
    """The goodbye after an exit phrase or `end_conversation`: never silent."""
    return farewell(configured, language) or phrase("farewell", language)
