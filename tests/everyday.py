"""Everyday sentences written for the tests, with an English rendering, and texts built from them: what the tests
read when ../shared/data is not beside the checkout (a bare clone), so they need no dataset."""

from __future__ import annotations

SENTENCES = [  # Chinese, one short sentence each
    "我爱你。",
    "他休息两天。",
    "我只有几支笔。",
    "今天天气很好。",
    "你叫什么名字？",
    "我们明天去北京。",
    "这本书很有意思。",
    "她每天早上喝咖啡。",
    "我不知道他在哪里。",
    "请把门关上。",
    "你会说中文吗？",
    "我的猫喜欢睡觉。",
    "他们在公园里踢足球。",
    "这个问题很难回答。",
    "我昨天买了一辆新车。",
    "火车几点出发？",
    "我想学习日语。",
    "汤姆是我最好的朋友。",
    "外面在下雨。",
    "你能帮我一下吗？",
    "我已经吃过晚饭了。",
    "这是我第一次来中国。",
    "他比我高。",
    "我们应该早点回家。",
    "她的妈妈是医生。",
    "我喜欢听音乐。",
    "这家餐厅的菜很好吃。",
    "我忘了带钥匙。",
    "明天会下雪吗？",
    "孩子们在学校学习。",
    "我每天走路去上班。",
    "你为什么不来？",
    "这件衣服太贵了。",
    "我觉得他说得对。",
    "请慢慢说。",
    "我很高兴见到你。",
    "他正在看电视。",
    "我们需要更多的时间。",
    "医院在哪里？",
    "我会尽力的。",
]

ENGLISH = [
    "I love you.",
    "He is resting for two days.",
    "I only have a few pens.",
    "The weather is nice today.",
    "What is your name?",
    "We are going to Beijing tomorrow.",
    "This book is very interesting.",
    "She drinks coffee every morning.",
    "I don't know where he is.",
    "Please close the door.",
    "Can you speak Chinese?",
    "My cat likes to sleep.",
    "They are playing football in the park.",
    "This question is hard to answer.",
    "I bought a new car yesterday.",
    "What time does the train leave?",
    "I want to learn Japanese.",
    "Tom is my best friend.",
    "It's raining outside.",
    "Can you help me for a moment?",
    "I've already had dinner.",
    "This is my first time in China.",
    "He is taller than me.",
    "We should go home early.",
    "Her mother is a doctor.",
    "I like listening to music.",
    "The food at this restaurant is delicious.",
    "I forgot to bring my keys.",
    "Will it snow tomorrow?",
    "The children are studying at school.",
    "I walk to work every day.",
    "Why aren't you coming?",
    "This dress is too expensive.",
    "I think he is right.",
    "Please speak slowly.",
    "I'm very glad to meet you.",
    "He is watching TV.",
    "We need more time.",
    "Where is the hospital?",
    "I'll do my best.",
]


def runs(count: int) -> list[str]:
    """``count`` Chinese texts as a test set varies: each sentence alone, then runs of two and of three neighbours;
    the last text is a run of eight, longer than any other by far (as a test set's longest sentence is)."""
    n = len(SENTENCES)
    texts = [SENTENCES[i] for i in range(n)]
    texts += ["".join(SENTENCES[(i + k) % n] for k in range(2)) for i in range(n)]
    texts += ["".join(SENTENCES[(i + k) % n] for k in range(3)) for i in range(n)]
    texts = [texts[i % len(texts)] for i in range(count - 1)]
    return [*texts, "".join(SENTENCES[:8])]
